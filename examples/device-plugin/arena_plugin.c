/*
 * arena_plugin.c: a sample BCL device plugin (include/bcl_device_plugin.h), as a vendor would
 * write one. Its "devices" keep their memory in an arena of their own, reached only through
 * handles (like BCL's `sim` backend), and reduce with kernels of their own, written here in C
 * from the header's semantics (BCL's tests hold them against an independent reference). Every
 * operation completes before it returns, so every ticket is done at once.
 *
 * Build: cc -std=gnu11 -O2 -fPIC -shared -I include examples/device-plugin/arena_plugin.c \
 *          -o libarena_plugin.so -lm
 * Use:   BCL_DEVICE_PLUGIN=$PWD/libarena_plugin.so bcl-bench allreduce --devices plugin:0,cpu
 *
 * The tests also build it broken on purpose, one way per macro: ARENA_BROKEN_VERSION (a table
 * of another version), ARENA_BROKEN_NULL_ENTRY (no divide), ARENA_BROKEN_SYMBOL (the table
 * under another name), ARENA_BROKEN_ZERO_DEVICES, ARENA_BROKEN_INIT (init fails),
 * ARENA_BROKEN_ALLOC (every allocation fails), so that BCL's refusals are tested.
 */
#include <bcl_device_plugin.h>

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_DEVICES 2
#define ARENA_SLOTS 4096

static __thread char last_error[256];

static bclDevResult_t fail(bclDevResult_t code, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, args);
  va_end(args);
  return code;
}

typedef struct {
  unsigned char* bytes;
  size_t len;
  uint32_t generation;
  int used;
} Slot;

typedef struct {
  pthread_mutex_t lock;
  Slot slots[ARENA_SLOTS];
  uint64_t tickets; /* the last ticket handed out */
  uint64_t streams; /* streams 1..streams exist; 0 is the default */
} Device;

static Device arena[ARENA_DEVICES];

/* A handle: the slot's generation above, its index + 1 below (so never 0). */
__attribute__((unused)) static bclDevMem_t handle_of(uint32_t index, uint32_t generation) {
  return ((uint64_t)generation << 32) | (uint64_t)(index + 1);
}

static bclDevResult_t check_device(int device) {
  if (device < 0 || device >= ARENA_DEVICES) {
    return fail(bclDevInvalidArgument, "arena has no device %d (it has %d)", device,
                ARENA_DEVICES);
  }
  return bclDevSuccess;
}

static bclDevResult_t check_stream(Device* d, bclDevStream_t stream) {
  if (stream > d->streams) {
    return fail(bclDevInvalidArgument, "stream %llu does not exist", (unsigned long long)stream);
  }
  return bclDevSuccess;
}

/* The bytes offset..offset+bytes of `mem` (the device's lock held), or NULL with the error. */
static unsigned char* resolve(Device* d, bclDevMem_t mem, size_t offset, size_t bytes,
                              bclDevResult_t* rc) {
  uint32_t low = (uint32_t)mem;
  uint32_t index = low - 1;
  uint32_t generation = (uint32_t)(mem >> 32);
  if (low == 0 || index >= ARENA_SLOTS || !d->slots[index].used ||
      d->slots[index].generation != generation) {
    *rc = fail(bclDevInvalidArgument, "handle %#llx is not a live allocation",
               (unsigned long long)mem);
    return NULL;
  }
  Slot* s = &d->slots[index];
  if (offset > s->len || bytes > s->len - offset) {
    *rc = fail(bclDevInvalidArgument, "bytes %zu..%zu are outside an allocation of %zu", offset,
               offset + bytes, s->len);
    return NULL;
  }
  *rc = bclDevSuccess;
  return s->bytes + offset;
}

/* ---------------------------------------------------------------- element arithmetic */

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    /* Zero or subnormal: mant * 2^-24, exact in float. */
    float v = (float)mant * 0x1p-24f;
    return sign ? -v : v;
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Round a float to the nearest fp16, ties to even. */
static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t exp = (x >> 23) & 0xff;
  uint32_t mant = x & 0x7fffff;
  if (exp == 0xff) {
    return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 | (mant >> 13) : 0));
  }
  int e = (int)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return (uint16_t)sign;
    uint32_t m = mant | 0x800000;
    int shift = 14 - e;
    uint32_t rounded = (m + (1u << (shift - 1)) - 1 + ((m >> shift) & 1)) >> shift;
    return (uint16_t)(sign | rounded);
  }
  uint32_t rounded = (mant + 0xfff + ((mant >> 13) & 1)) >> 13;
  return (uint16_t)(sign | (((uint32_t)e << 10) + rounded));
}

static float bf16_to_f32(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Round a float to the nearest bf16, ties to even. */
static uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* min/max: a NaN, quiet or signaling, loses against a number (fminf would turn a signaling
 * NaN into a NaN result, which is not BCL's rule). */
#define MIN_NUM(a, b) ((a) != (a) ? (b) : (b) != (b) ? (a) : (b) < (a) ? (b) : (a))
#define MAX_NUM(a, b) ((a) != (a) ? (b) : (b) != (b) ? (a) : (b) > (a) ? (b) : (a))

static float apply_f(float a, float b, bclRedOp_t op) {
  switch (op) {
    case bclProd: return a * b;
    case bclMin: return MIN_NUM(a, b);
    case bclMax: return MAX_NUM(a, b);
    default: return a + b;
  }
}

static double apply_d(double a, double b, bclRedOp_t op) {
  switch (op) {
    case bclProd: return a * b;
    case bclMin: return MIN_NUM(a, b);
    case bclMax: return MAX_NUM(a, b);
    default: return a + b;
  }
}

/* Integers wrap: the arithmetic runs on the unsigned type of the same width. */
#define INT_KERNEL(NAME, T, U)                                                 \
  static void NAME(unsigned char* dst, const unsigned char* src, size_t n,    \
                   bclRedOp_t op) {                                            \
    for (size_t i = 0; i < n; i++) {                                           \
      T a, b, r;                                                               \
      memcpy(&a, dst + i * sizeof(T), sizeof(T));                              \
      memcpy(&b, src + i * sizeof(T), sizeof(T));                              \
      switch (op) {                                                            \
        case bclProd: r = (T)((U)a * (U)b); break;                             \
        case bclMin: r = a < b ? a : b; break;                                 \
        case bclMax: r = a > b ? a : b; break;                                 \
        default: r = (T)((U)a + (U)b); break;                                  \
      }                                                                        \
      memcpy(dst + i * sizeof(T), &r, sizeof(T));                              \
    }                                                                          \
  }
INT_KERNEL(reduce_i8, int8_t, uint32_t)
INT_KERNEL(reduce_u8, uint8_t, uint32_t)
INT_KERNEL(reduce_i32, int32_t, uint32_t)
INT_KERNEL(reduce_u32, uint32_t, uint32_t)
INT_KERNEL(reduce_i64, int64_t, uint64_t)
INT_KERNEL(reduce_u64, uint64_t, uint64_t)

static size_t element_size(bclDataType_t t) {
  switch (t) {
    case bclInt8: case bclUint8: return 1;
    case bclFloat16: case bclBfloat16: return 2;
    case bclInt32: case bclUint32: case bclFloat32: return 4;
    case bclInt64: case bclUint64: case bclFloat64: return 8;
    default: return 0;
  }
}

static bclDevResult_t check_elements(bclDataType_t t, size_t bytes) {
  size_t size = element_size(t);
  if (size == 0) return fail(bclDevInvalidArgument, "datatype %d is not a bclDataType_t", (int)t);
  if (bytes % size) {
    return fail(bclDevInvalidArgument, "%zu bytes is not a whole number of elements", bytes);
  }
  return bclDevSuccess;
}

static bclDevResult_t reduce_bytes(unsigned char* dst, const unsigned char* src, size_t bytes,
                                   bclDataType_t t, bclRedOp_t op) {
  bclDevResult_t rc = check_elements(t, bytes);
  if (rc) return rc;
  if (op < bclSum || op > bclMin) {
    return fail(bclDevInvalidArgument, "op %d is not sum, prod, max or min", (int)op);
  }
  size_t n = bytes / element_size(t);
  switch (t) {
    case bclInt8: reduce_i8(dst, src, n, op); break;
    case bclUint8: reduce_u8(dst, src, n, op); break;
    case bclInt32: reduce_i32(dst, src, n, op); break;
    case bclUint32: reduce_u32(dst, src, n, op); break;
    case bclInt64: reduce_i64(dst, src, n, op); break;
    case bclUint64: reduce_u64(dst, src, n, op); break;
    case bclFloat16:
    case bclBfloat16:
      for (size_t i = 0; i < n; i++) {
        uint16_t a, b;
        memcpy(&a, dst + 2 * i, 2);
        memcpy(&b, src + 2 * i, 2);
        uint16_t r = t == bclFloat16
                         ? f32_to_f16(apply_f(f16_to_f32(a), f16_to_f32(b), op))
                         : f32_to_bf16(apply_f(bf16_to_f32(a), bf16_to_f32(b), op));
        memcpy(dst + 2 * i, &r, 2);
      }
      break;
    case bclFloat32:
      for (size_t i = 0; i < n; i++) {
        float a, b;
        memcpy(&a, dst + 4 * i, 4);
        memcpy(&b, src + 4 * i, 4);
        a = apply_f(a, b, op);
        memcpy(dst + 4 * i, &a, 4);
      }
      break;
    case bclFloat64:
      for (size_t i = 0; i < n; i++) {
        double a, b;
        memcpy(&a, dst + 8 * i, 8);
        memcpy(&b, src + 8 * i, 8);
        a = apply_d(a, b, op);
        memcpy(dst + 8 * i, &a, 8);
      }
      break;
    default: break;
  }
  return bclDevSuccess;
}

/* Integers truncate toward zero; the divisor may exceed the type (then in 128 bits). */
#define DIVIDE_INT(T)                                                   \
  for (size_t i = 0; i < n; i++) {                                      \
    T a;                                                                \
    memcpy(&a, dst + i * sizeof(T), sizeof(T));                         \
    a = (T)((__int128)a / (__int128)divisor);                           \
    memcpy(dst + i * sizeof(T), &a, sizeof(T));                         \
  }

static bclDevResult_t divide_bytes(unsigned char* dst, size_t bytes, bclDataType_t t,
                                   size_t divisor) {
  bclDevResult_t rc = check_elements(t, bytes);
  if (rc) return rc;
  if (divisor == 0) return fail(bclDevInvalidArgument, "divide by 0");
  size_t n = bytes / element_size(t);
  switch (t) {
    case bclInt8: DIVIDE_INT(int8_t) break;
    case bclUint8: DIVIDE_INT(uint8_t) break;
    case bclInt32: DIVIDE_INT(int32_t) break;
    case bclUint32: DIVIDE_INT(uint32_t) break;
    case bclInt64: DIVIDE_INT(int64_t) break;
    case bclUint64: DIVIDE_INT(uint64_t) break;
    case bclFloat16:
    case bclBfloat16:
      for (size_t i = 0; i < n; i++) {
        uint16_t a;
        memcpy(&a, dst + 2 * i, 2);
        a = t == bclFloat16 ? f32_to_f16(f16_to_f32(a) / (float)divisor)
                            : f32_to_bf16(bf16_to_f32(a) / (float)divisor);
        memcpy(dst + 2 * i, &a, 2);
      }
      break;
    case bclFloat32:
      for (size_t i = 0; i < n; i++) {
        float a;
        memcpy(&a, dst + 4 * i, 4);
        a /= (float)divisor;
        memcpy(dst + 4 * i, &a, 4);
      }
      break;
    case bclFloat64:
      for (size_t i = 0; i < n; i++) {
        double a;
        memcpy(&a, dst + 8 * i, 8);
        a /= (double)divisor;
        memcpy(dst + 8 * i, &a, 8);
      }
      break;
    default: break;
  }
  return bclDevSuccess;
}

/* ---------------------------------------------------------------- the entries */

static bclDevResult_t arena_init(void) {
#ifdef ARENA_BROKEN_INIT
  return fail(bclDevInternalError, "no arena driver on this host");
#else
  for (int i = 0; i < ARENA_DEVICES; i++) {
    memset(&arena[i], 0, sizeof arena[i]);
    pthread_mutex_init(&arena[i].lock, NULL);
  }
  return bclDevSuccess;
#endif
}

static bclDevResult_t arena_finalize(void) {
  for (int i = 0; i < ARENA_DEVICES; i++) {
    for (int s = 0; s < ARENA_SLOTS; s++) free(arena[i].slots[s].bytes);
    pthread_mutex_destroy(&arena[i].lock);
    memset(&arena[i], 0, sizeof arena[i]);
  }
  return bclDevSuccess;
}

static bclDevResult_t arena_devices(int* count) {
  if (!count) return fail(bclDevInvalidArgument, "count is NULL");
#ifdef ARENA_BROKEN_ZERO_DEVICES
  *count = 0;
#else
  *count = ARENA_DEVICES;
#endif
  return bclDevSuccess;
}

static bclDevResult_t arena_properties(int device, bclDeviceProperties_v1_t* props) {
  bclDevResult_t rc = check_device(device);
  if (rc) return rc;
  if (!props) return fail(bclDevInvalidArgument, "props is NULL");
  memset(props, 0, sizeof *props);
  snprintf(props->model, sizeof props->model, "arena device %d (sample plugin)", device);
  return bclDevSuccess;
}

static bclDevResult_t arena_alloc(int device, size_t bytes, bclDevMem_t* mem) {
  bclDevResult_t rc = check_device(device);
  if (rc) return rc;
  if (!mem) return fail(bclDevInvalidArgument, "mem is NULL");
#ifdef ARENA_BROKEN_ALLOC
  (void)bytes;
  return fail(bclDevOutOfMemory, "the arena is exhausted (built with ARENA_BROKEN_ALLOC)");
#else
  Device* d = &arena[device];
  pthread_mutex_lock(&d->lock);
  for (uint32_t i = 0; i < ARENA_SLOTS; i++) {
    Slot* s = &d->slots[i];
    if (s->used) continue;
    unsigned char* bytes_ = malloc(bytes ? bytes : 1);
    if (!bytes_) {
      pthread_mutex_unlock(&d->lock);
      return fail(bclDevOutOfMemory, "cannot allocate %zu bytes", bytes);
    }
    s->bytes = bytes_;
    s->len = bytes;
    s->used = 1;
    s->generation++;
    *mem = handle_of(i, s->generation);
    pthread_mutex_unlock(&d->lock);
    return bclDevSuccess;
  }
  pthread_mutex_unlock(&d->lock);
  return fail(bclDevOutOfMemory, "all %d arena slots are in use", ARENA_SLOTS);
#endif
}

static bclDevResult_t arena_free(int device, bclDevMem_t mem) {
  bclDevResult_t rc = check_device(device);
  if (rc) return rc;
  Device* d = &arena[device];
  pthread_mutex_lock(&d->lock);
  if (!resolve(d, mem, 0, 0, &rc)) {
    pthread_mutex_unlock(&d->lock);
    return rc;
  }
  Slot* s = &d->slots[(uint32_t)mem - 1];
  free(s->bytes);
  s->bytes = NULL;
  s->used = 0;
  pthread_mutex_unlock(&d->lock);
  return bclDevSuccess;
}

/* Lock `device`, check `stream`, resolve one range: the common start of every data entry. */
#define BEGIN(device, stream, mem, offset, bytes, ptr)             \
  bclDevResult_t rc = check_device(device);                        \
  if (rc) return rc;                                               \
  Device* d = &arena[device];                                      \
  pthread_mutex_lock(&d->lock);                                    \
  rc = check_stream(d, stream);                                    \
  unsigned char* ptr = rc ? NULL : resolve(d, mem, offset, bytes, &rc); \
  if (!ptr) {                                                      \
    pthread_mutex_unlock(&d->lock);                                \
    return rc;                                                     \
  }

static bclDevResult_t arena_copy_to_device(int device, bclDevMem_t dst, size_t dst_offset,
                                           const void* src, size_t bytes,
                                           bclDevStream_t stream) {
  BEGIN(device, stream, dst, dst_offset, bytes, to)
  if (bytes) memcpy(to, src, bytes);
  pthread_mutex_unlock(&d->lock);
  return bclDevSuccess;
}

static bclDevResult_t arena_copy_to_host(int device, void* dst, bclDevMem_t src,
                                         size_t src_offset, size_t bytes,
                                         bclDevStream_t stream) {
  BEGIN(device, stream, src, src_offset, bytes, from)
  if (bytes) memcpy(dst, from, bytes);
  pthread_mutex_unlock(&d->lock);
  return bclDevSuccess;
}

static bclDevResult_t arena_copy_on_device(int device, bclDevMem_t dst, size_t dst_offset,
                                           bclDevMem_t src, size_t src_offset, size_t bytes,
                                           bclDevStream_t stream) {
  BEGIN(device, stream, dst, dst_offset, bytes, to)
  unsigned char* from = resolve(d, src, src_offset, bytes, &rc);
  if (from && bytes) memmove(to, from, bytes);
  pthread_mutex_unlock(&d->lock);
  return from ? bclDevSuccess : rc;
}

static bclDevResult_t arena_reduce_from_host(int device, bclDevMem_t dst, size_t dst_offset,
                                             const void* src, size_t bytes, bclDataType_t t,
                                             bclRedOp_t op, bclDevStream_t stream) {
  BEGIN(device, stream, dst, dst_offset, bytes, to)
  rc = reduce_bytes(to, src, bytes, t, op);
  pthread_mutex_unlock(&d->lock);
  return rc;
}

static bclDevResult_t arena_reduce_on_device(int device, bclDevMem_t dst, size_t dst_offset,
                                             bclDevMem_t src, size_t src_offset, size_t bytes,
                                             bclDataType_t t, bclRedOp_t op,
                                             bclDevStream_t stream) {
  BEGIN(device, stream, dst, dst_offset, bytes, to)
  unsigned char* from = resolve(d, src, src_offset, bytes, &rc);
  if (from) rc = reduce_bytes(to, from, bytes, t, op);
  pthread_mutex_unlock(&d->lock);
  return rc;
}

__attribute__((unused)) static bclDevResult_t arena_divide(int device, bclDevMem_t dst, size_t dst_offset, size_t bytes,
                                   bclDataType_t t, size_t divisor, bclDevStream_t stream) {
  BEGIN(device, stream, dst, dst_offset, bytes, to)
  rc = divide_bytes(to, bytes, t, divisor);
  pthread_mutex_unlock(&d->lock);
  return rc;
}

static bclDevResult_t arena_stream_create(int device, bclDevStream_t* stream) {
  bclDevResult_t rc = check_device(device);
  if (rc) return rc;
  if (!stream) return fail(bclDevInvalidArgument, "stream is NULL");
  pthread_mutex_lock(&arena[device].lock);
  *stream = ++arena[device].streams;
  pthread_mutex_unlock(&arena[device].lock);
  return bclDevSuccess;
}

static bclDevResult_t arena_stream_synchronize(int device, bclDevStream_t stream) {
  bclDevResult_t rc = check_device(device);
  if (rc) return rc;
  pthread_mutex_lock(&arena[device].lock);
  rc = check_stream(&arena[device], stream);
  pthread_mutex_unlock(&arena[device].lock);
  return rc;
}

static bclDevResult_t arena_event_record(int device, bclDevStream_t stream,
                                         bclDevTicket_t* ticket) {
  bclDevResult_t rc = check_device(device);
  if (rc) return rc;
  if (!ticket) return fail(bclDevInvalidArgument, "ticket is NULL");
  pthread_mutex_lock(&arena[device].lock);
  rc = check_stream(&arena[device], stream);
  if (!rc) *ticket = ++arena[device].tickets;
  pthread_mutex_unlock(&arena[device].lock);
  return rc;
}

static bclDevResult_t arena_event_query(int device, bclDevTicket_t ticket, int* done) {
  bclDevResult_t rc = check_device(device);
  if (rc) return rc;
  if (!done) return fail(bclDevInvalidArgument, "done is NULL");
  pthread_mutex_lock(&arena[device].lock);
  int known = ticket >= 1 && ticket <= arena[device].tickets;
  pthread_mutex_unlock(&arena[device].lock);
  if (!known) return fail(bclDevInvalidArgument, "ticket %llu was never recorded",
                          (unsigned long long)ticket);
  *done = 1; /* every operation completed before it returned */
  return bclDevSuccess;
}

static const char* arena_last_error(void) { return last_error; }

#ifdef ARENA_BROKEN_SYMBOL
#define ARENA_TABLE bclDevicePlugin_v0
#else
#define ARENA_TABLE bclDevicePlugin_v1
#endif

const bclDevicePlugin_v1_t ARENA_TABLE = {
    .name = "arena",
#ifdef ARENA_BROKEN_VERSION
    .version = 99,
#else
    .version = BCL_DEVICE_PLUGIN_VERSION,
#endif
    .init = arena_init,
    .finalize = arena_finalize,
    .devices = arena_devices,
    .getProperties = arena_properties,
    .memAlloc = arena_alloc,
    .memFree = arena_free,
    .copyToDevice = arena_copy_to_device,
    .copyToHost = arena_copy_to_host,
    .copyOnDevice = arena_copy_on_device,
    .reduceFromHost = arena_reduce_from_host,
    .reduceOnDevice = arena_reduce_on_device,
#ifdef ARENA_BROKEN_NULL_ENTRY
    .divide = NULL,
#else
    .divide = arena_divide,
#endif
    .streamCreate = arena_stream_create,
    .streamSynchronize = arena_stream_synchronize,
    .eventRecord = arena_event_record,
    .eventQuery = arena_event_query,
    .lastError = arena_last_error,
};
