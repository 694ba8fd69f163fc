# Build and install libbcl (shared and static), bcl.h, bcl_device_plugin.h and bcl.pc:
#   make install PREFIX=/opt/bcl
#   cc app.c $(PKG_CONFIG_PATH=/opt/bcl/lib/pkgconfig pkg-config --cflags --libs bcl)
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
VERSION := 0.1.0

.PHONY: build install

build:
	cargo build --release --locked -p bcl-ffi

install: build
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)
	install -m 755 target/release/libbcl.so $(DESTDIR)$(LIBDIR)/libbcl.so
	install -m 644 target/release/libbcl.a $(DESTDIR)$(LIBDIR)/libbcl.a
	install -m 644 include/bcl.h $(DESTDIR)$(INCLUDEDIR)/bcl.h
	install -m 644 include/bcl_device_plugin.h $(DESTDIR)$(INCLUDEDIR)/bcl_device_plugin.h
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
	    -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' -e 's|@VERSION@|$(VERSION)|g' \
	    bcl.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/bcl.pc
