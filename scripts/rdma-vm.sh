#!/usr/bin/env bash
# Runs a command under a real verbs stack: Debian's stock kernel booted under qemu (TCG) with
# Soft-RoCE (rdma_rxe on a dummy netdev), the host's root filesystem shared read-only over 9p and
# the command run in a chroot of it. Recipe: ../shared/design/rdma-softroce-vm.md.
#
#   scripts/rdma-vm.sh install            # Debian packages + the kernel (idempotent; needs root)
#   scripts/rdma-vm.sh run 'CMD' [OUTDIR] # boot, run CMD (bash -c, cwd = this repo), power off;
#                                         # exits with CMD's status; OUTDIR is mounted read-write
#                                         # at the same path inside the guest (default target/rdma-vm/out)
#
# Inside the guest: device rxe0 on dummy0 (10.251.0.1/24) and rxe1 on dummy1 (10.251.1.1/24),
# GID index 1 = the IPv4-mapped GID. Two guests joined by a virtual wire (scripts/rdma-two-vms.sh):
# BCL_RDMA_VM_WIRE=listen=:PORT or connect=127.0.0.1:PORT and BCL_RDMA_VM_IP=10.253.0.N give the
# guest a virtio NIC eth0 on a qemu socket netdev, with that address and rxe2 on it;
# BCL_RDMA_VM_WIRE=tap=NAME puts eth0 on a host tap device instead (scripts/rdma-four-vms.sh
# joins four guests on a bridge that way).
# BCL_RDMA_VM=1 is set there so tests know the device must exist.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
work="$repo/target/rdma-vm"
kernel_version=""
modules=(crc32_generic virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio virtio_pci
  failover net_failover virtio_net 9pnet 9pnet_virtio netfs fscache 9p veth dummy ib_core
  ib_uverbs udp_tunnel ip6_udp_tunnel rdma_rxe)

install() {
  export DEBIAN_FRONTEND=noninteractive
  local sources=/etc/apt/sources.list.d/bcl-bookworm-backports.list
  if ! qemu-system-x86_64 --version >/dev/null 2>&1 || ! command -v busybox >/dev/null \
    || ! command -v ib_write_bw >/dev/null || ! command -v cpio >/dev/null || ! command -v rdma >/dev/null \
    || [ ! -e /usr/lib/x86_64-linux-gnu/libibverbs.so.1 ]; then
    echo "deb http://deb.debian.org/debian bookworm-backports main" > "$sources"
    apt-get update -qq
    # qemu-utils 10 from backports is already on these machines: bookworm's qemu-system 7.2
    # would remove it, so take both from backports.
    apt-get install -y -qq -t bookworm-backports qemu-system-x86 qemu-utils >/dev/null
    apt-get install -y -qq busybox-static libibverbs1 ibverbs-providers iproute2 \
      ibverbs-utils perftest cpio >/dev/null
  fi
  mkdir -p "$work"
  kernel_version=$(apt-cache depends linux-image-amd64 | sed -n 's/.*Depends: linux-image-\(.*-amd64\)$/\1/p' | head -1)
  [ -n "$kernel_version" ] || { echo "rdma-vm: cannot resolve linux-image-amd64's kernel" >&2; exit 1; }
  if [ ! -e "$work/kernel/boot/vmlinuz-$kernel_version" ]; then
    rm -rf "$work/kernel" "$work"/linux-image-*.deb
    (cd "$work" && apt-get download "linux-image-$kernel_version" 2>/dev/null)
    dpkg-deb -x "$work"/linux-image-"$kernel_version"_*.deb "$work/kernel"
    rm -f "$work"/linux-image-*.deb "$work/initrd.cpio.gz"
  fi
  echo "$kernel_version" > "$work/kernel-version"
  build_initrd
}

build_initrd() {
  kernel_version=$(cat "$work/kernel-version")
  [ -e "$work/initrd.cpio.gz" ] && [ "$work/initrd.cpio.gz" -nt "$0" ] && return 0
  local root="$work/initrd"
  rm -rf "$root" && mkdir -p "$root"/{bin,proc,sys,dev,host,modules}
  cp /bin/busybox "$root/bin/busybox"
  local m f
  for m in "${modules[@]}"; do
    f=$(find "$work/kernel/lib/modules/$kernel_version" -name "$m.ko*" | head -1)
    [ -n "$f" ] || { echo "rdma-vm: module $m missing from the kernel package" >&2; exit 1; }
    case "$f" in
      *.ko.xz) xz -dc "$f" > "$root/modules/$m.ko" ;;
      *.ko.zst) zstd -qdc "$f" > "$root/modules/$m.ko" ;;
      *) cp "$f" "$root/modules/$m.ko" ;;
    esac
  done
  cat > "$root/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in ${modules[*]}; do insmod /modules/\$m.ko || echo "rdma-vm: insmod \$m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro host /host || echo "rdma-vm: mount host failed"
mount -t proc proc /host/proc; mount -t sysfs sys /host/sys; mount -t devtmpfs dev /host/dev
mount -t tmpfs run /host/run; mount -t tmpfs tmp /host/tmp
mkdir -p /host/dev/pts /host/dev/shm; mount -t devpts pts /host/dev/pts; mount -t tmpfs shm /host/dev/shm
out=\$(cat /proc/cmdline | sed -n 's/.*bcl_out=\([^ ]*\).*/\1/p')
mount -t 9p -o trans=virtio,version=9p2000.L,rw out /host\$out || echo "rdma-vm: mount out failed"
chroot /host /bin/bash \$out/guest.sh
echo "rdma-vm: guest exit \$?"
poweroff -f
INIT
  chmod +x "$root/init"
  (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initrd.cpio.gz.tmp"
  mv "$work/initrd.cpio.gz.tmp" "$work/initrd.cpio.gz"
}

run() {
  local cmd=$1 out=${2:-$work/out}
  [ -e "$work/kernel-version" ] || install
  build_initrd
  kernel_version=$(cat "$work/kernel-version")
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  cat > "$out/guest.sh" <<GUEST
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root BCL_RDMA_VM=1
export RUST_BACKTRACE=1 TMPDIR=/tmp
ip link set lo up
ip link show dummy0 >/dev/null 2>&1 || ip link add dummy0 type dummy
ip addr add 10.251.0.1/24 dev dummy0
ip link set dummy0 up
rdma link add rxe0 type rxe netdev dummy0 || { echo "rdma-vm: rdma link add failed"; exit 97; }
# A second device on a second netdev, for several queue pairs per peer over two devices.
ip link add dummy1 type dummy
ip addr add 10.251.1.1/24 dev dummy1
ip link set dummy1 up
rdma link add rxe1 type rxe netdev dummy1 || { echo "rdma-vm: rdma link add rxe1 failed"; exit 97; }
if [ -n "${BCL_RDMA_VM_IP:-}" ]; then
  ip addr add ${BCL_RDMA_VM_IP:-}/24 dev eth0 && ip link set eth0 up &&
    rdma link add rxe2 type rxe netdev eth0 || { echo "rdma-vm: rxe2 on eth0 failed"; exit 97; }
fi
cd "$repo"
bash -c $(printf '%q' "$cmd")
GUEST
  local log="$out/console.log"
  local smp=${BCL_RDMA_VM_CPUS:-$(nproc)}
  local nic=(-nic none)
  if [ -n "${BCL_RDMA_VM_WIRE:-}" ]; then
    local last=${BCL_RDMA_VM_IP##*.} netdev="socket,id=wire,$BCL_RDMA_VM_WIRE"
    # tap=NAME: a host tap device (on a bridge the caller made) instead of a socket.
    [ "${BCL_RDMA_VM_WIRE#tap=}" != "$BCL_RDMA_VM_WIRE" ] &&
      netdev="tap,id=wire,ifname=${BCL_RDMA_VM_WIRE#tap=},script=no,downscript=no"
    nic=(-netdev "$netdev"
      -device "virtio-net-pci,netdev=wire,mac=52:54:00:00:00:$(printf %02x "$last")")
  fi
  timeout "${BCL_RDMA_VM_TIMEOUT:-1200}" qemu-system-x86_64 -accel tcg,thread=multi -cpu max \
    -m "${BCL_RDMA_VM_MEMORY:-3072}" -smp "$smp" \
    -kernel "$work/kernel/boot/vmlinuz-$kernel_version" -initrd "$work/initrd.cpio.gz" \
    -append "console=ttyS0 loglevel=4 panic=-1 rdinit=/init bcl_out=$out" \
    -nographic -no-reboot "${nic[@]}" \
    -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$out,mount_tag=out,security_model=none,multidevs=remap" \
    < /dev/null 2>&1 | tee "$log" | sed -u 's/\r$//' || true
  local status
  status=$(sed -n 's/.*rdma-vm: guest exit \([0-9]*\).*/\1/p' "$log" | tail -1)
  if [ -z "$status" ]; then
    echo "rdma-vm: the guest did not report an exit status (boot failure or timeout); console: $log" >&2
    return 98
  fi
  return "$status"
}

case "${1:-}" in
  install) install ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 install | run 'CMD' [OUTDIR]" >&2; exit 2 ;;
esac
