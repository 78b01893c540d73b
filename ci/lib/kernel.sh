# shellcheck shell=bash disable=SC2034 # globals are used by ci/vm
# Guest kernel cache for ci/vm: find the Debian kernel through apt, unpack it
# (plus modules) into the project cache, build the initramfs and, optionally,
# the out-of-tree soft-iWARP module.  Nothing is installed on the host.
#
# Sourced by ci/vm.  Expects: CI_DIR, VM_CACHE (absolute), vm_say, vm_die.
# Sets: KVER, KPKG, KPKGVER, KDIR, KERNEL_IMAGE (bzImage), KERNEL_BOOT (what
#       QEMU boots: vmlinux or bzImage), KERNEL_INITRD, KERNEL_MODULES,
#       SIW_KO (path to siw.ko, empty if unavailable), SIW_REASON.

# Module directories left out of the unpacked kernel: large and never needed
# by a headless RDMA test guest. The DRM core and vgem stay: vgem's buffers
# are the dma-bufs the tests register (rdma's tests/dmabuf.rs); the GPU
# drivers go.
KERNEL_EXCLUDES=(
  'kernel/drivers/gpu/drm/amd' 'kernel/drivers/gpu/drm/nouveau'
  'kernel/drivers/gpu/drm/i915' 'kernel/drivers/gpu/drm/radeon'
  'kernel/sound' 'kernel/drivers/media'
  'kernel/drivers/net/wireless' 'kernel/drivers/staging' 'kernel/drivers/iio'
  'kernel/drivers/bluetooth' 'kernel/net/bluetooth'
)

# Modules the initramfs needs to reach the 9p root and build the overlay.
INITRD_MODULES=(virtio_pci 9pnet_virtio 9p overlay)

# Print one field (e.g. Version, Depends) of the candidate version of PKG.
apt_field() { # PKG FIELD
  { apt-cache show --no-all-versions -- "$1" 2>/dev/null || true; } |
    sed -n "s/^$2: //p" | head -n 1
}

# Resolve the kernel package to KPKG/KPKGVER/KVER.  apt-cache is slow on
# machines without a pkgcache, so the answer is remembered, keyed by the
# apt lists and the requested package.
kernel_resolve() {
  local want=${RDMA_VM_KERNEL_PKG:-linux-image-amd64}
  local key memo pkg ver dep i
  key=$( { echo "$want"; stat -c '%n %Y %s' /var/lib/apt/lists/*Packages* 2>/dev/null; } |
    sha256sum | cut -c1-16)
  memo=$VM_CACHE/resolve.$key
  if [[ -s $memo ]]; then
    read -r KPKG KPKGVER < "$memo"
  elif ! compgen -G '/var/lib/apt/lists/*Packages*' > /dev/null; then
    # No apt lists (purged, offline image): reuse the newest prepared kernel.
    local last
    # shellcheck disable=SC2012 # newest first; the names are our own
    last=$(ls -td "$VM_CACHE"/*/root/.done 2> /dev/null | head -n 1 || true)
    [[ -n $last ]] || vm_die "apt has no installable candidate for '$want' (try: apt-get update)"
    last=${last%/root/.done}
    read -r KPKG KPKGVER < "$last/package"
    vm_say "apt cannot resolve '$want'; using cached $KPKG $KPKGVER"
  else
    pkg=$want
    for i in 1 2 3 4; do
      ver=$(apt_field "$pkg" Version)
      [[ -n $ver ]] || vm_die "apt has no installable candidate for '$pkg' (try: apt-get update)"
      # Meta packages (linux-image-amd64, linux-image-6.12-amd64) depend on
      # the versioned image package; the image itself does not.
      dep=$(apt_field "$pkg" Depends | grep -o 'linux-image-[^ ,|]*' | head -n 1 || true)
      [[ -z $dep ]] && break
      pkg=$dep
      (( i < 4 )) || vm_die "cannot resolve '$want' to a kernel image package"
    done
    KPKG=$pkg KPKGVER=$ver
    rm -f "$VM_CACHE"/resolve.*
    printf '%s %s\n' "$KPKG" "$KPKGVER" > "$memo.$$"
    mv "$memo.$$" "$memo"
  fi
  KVER=${KPKG#linux-image-}
  [[ $KVER =~ ^[0-9]+\.[0-9]+ ]] || vm_die "'$KPKG' does not look like a kernel image package"
  KDIR=$VM_CACHE/$KVER
  KERNEL_IMAGE=$KDIR/root/boot/vmlinuz-$KVER
  KERNEL_MODULES=$KDIR/root/lib/modules
  KERNEL_INITRD=$KDIR/initrd.gz
}

# apt-get download PKG=VER... into the current directory (works as any user).
apt_download() {
  local log
  log=$(mktemp)
  if ! apt-get download "$@" > "$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

# Unpack the kernel image package into $KDIR/root and run depmod there.
kernel_unpack() {
  # .done holds the excludes it was unpacked with: a change unpacks again.
  [[ -f $KDIR/root/.done && -f $KERNEL_IMAGE &&
    $(cat "$KDIR/root/.done") == "${KERNEL_EXCLUDES[*]}" ]] && return 0
  vm_say "fetching kernel $KVER ($KPKG $KPKGVER)"
  local tmp=$KDIR/root.tmp ex=() d deb
  rm -rf "$tmp" "$KDIR/root" "$KDIR/debs"
  mkdir -p "$tmp" "$KDIR/debs"
  (cd "$KDIR/debs" && apt_download "$KPKG=$KPKGVER") || vm_die "downloading $KPKG failed"
  deb=$(echo "$KDIR"/debs/"$KPKG"_*.deb)
  for d in "${KERNEL_EXCLUDES[@]}"; do ex+=("--exclude=./lib/modules/$KVER/$d"); done
  dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" "${ex[@]}" ||
    vm_die "unpacking $deb failed"
  rm -rf "$KDIR/debs"
  # Debian 12 ships modules under /lib; newer releases may use /usr/lib.
  if [[ ! -d $tmp/lib/modules/$KVER && -d $tmp/usr/lib/modules/$KVER ]]; then
    mkdir -p "$tmp/lib" && mv "$tmp/usr/lib/modules" "$tmp/lib/modules"
  fi
  [[ -f $tmp/boot/vmlinuz-$KVER ]] || vm_die "no vmlinuz-$KVER in $KPKG"
  depmod -b "$tmp" "$KVER" || vm_die "depmod failed"
  printf '%s\n' "${KERNEL_EXCLUDES[*]}" > "$tmp/.done"
  mv "$tmp" "$KDIR/root"
  printf '%s %s\n' "$KPKG" "$KPKGVER" > "$KDIR/package"
}

# Under TCG, firmware + in-guest decompression of the bzImage cost ~3 s.
# QEMU can instead load the uncompressed ELF directly through its PVH entry
# point (~0.5 s).  Extract it once; without a PVH note keep the bzImage.
kernel_extract_vmlinux() {
  KERNEL_BOOT=$KERNEL_IMAGE
  if [[ -f $KDIR/vmlinux ]]; then KERNEL_BOOT=$KDIR/vmlinux; return 0; fi
  [[ -f $KDIR/vmlinux.none ]] && return 0
  local magic off
  local -a tool
  for magic in '\xfd7zXZ\x00' '\x1f\x8b\x08\x00' '\x28\xb5\x2f\xfd'; do
    case $magic in
      *7zXZ*) tool=(xz -dc --single-stream) ;;
      *x1f*) tool=(gzip -dc) ;;
      *) tool=(zstd -qdc) ;;
    esac
    command -v "${tool[0]}" > /dev/null || continue
    off=$(LC_ALL=C grep -obUaP "$magic" "$KERNEL_IMAGE" | head -n 1 | cut -d: -f1 || true)
    [[ -n $off ]] || continue
    tail -c +$((off + 1)) "$KERNEL_IMAGE" | "${tool[@]}" > "$KDIR/vmlinux.tmp" 2> /dev/null || true
    # An ELF image with a Xen PHYS32_ENTRY (type 18) note boots through PVH.
    if [[ $(head -c 4 "$KDIR/vmlinux.tmp") == $'\x7fELF' ]] &&
      LC_ALL=C grep -qaP '\x04\x00\x00\x00[\x04\x08]\x00\x00\x00\x12\x00\x00\x00Xen\x00' "$KDIR/vmlinux.tmp"; then
      mv "$KDIR/vmlinux.tmp" "$KDIR/vmlinux"
      KERNEL_BOOT=$KDIR/vmlinux
      return 0
    fi
  done
  rm -f "$KDIR/vmlinux.tmp"
  touch "$KDIR/vmlinux.none"
}

# Build the initramfs: static busybox, the modules to reach the 9p root, and
# ci/lib/guest-init.sh as /init.  Rebuilt when the init script changes.
initrd_build() {
  local mods key
  mods=$(modprobe -d "$KDIR/root" -S "$KVER" -a --show-depends "${INITRD_MODULES[@]}") ||
    vm_die "modprobe --show-depends failed for $KVER"
  key=$( { cat "$CI_DIR/lib/guest-init.sh" /bin/busybox; echo "$mods"; } | sha256sum | cut -c1-32)
  [[ -f $KERNEL_INITRD && $(cat "$KDIR/initrd.key" 2>/dev/null) == "$key" ]] && return 0
  vm_say "building initramfs for $KVER"
  local dir=$KDIR/initrd.d n=0 path base
  local -A seen=()
  rm -rf "$dir"
  mkdir -p "$dir"/{bin,mods,proc,sys,dev,lower,upper,newroot}
  cp /bin/busybox "$dir/bin/busybox"
  cp "$CI_DIR/lib/guest-init.sh" "$dir/init"
  chmod 0755 "$dir/init" "$dir/bin/busybox"
  while read -r verb path _; do
    [[ $verb == insmod && -z ${seen[$path]:-} ]] || continue
    seen[$path]=1
    base=$(basename "$path"); base=${base%%.ko*}
    printf -v base '%02d_%s.ko' "$n" "$base"
    n=$((n + 1))
    case $path in
      *.ko) cp "$path" "$dir/mods/$base" ;;
      *.ko.xz) xz -dc "$path" > "$dir/mods/$base" ;;
      *.ko.gz) gzip -dc "$path" > "$dir/mods/$base" ;;
      *.ko.zst) zstd -qdc "$path" > "$dir/mods/$base" ;;
      *) vm_die "unexpected module file $path" ;;
    esac || vm_die "cannot copy $path into the initramfs"
  done <<< "$mods"
  (cd "$dir" && find . -print0 | LC_ALL=C sort -z |
    cpio --quiet -o -0 -H newc -R 0:0 | gzip -1) > "$KERNEL_INITRD.tmp" ||
    vm_die "cpio failed"
  mv "$KERNEL_INITRD.tmp" "$KERNEL_INITRD"
  echo "$key" > "$KDIR/initrd.key"
  rm -rf "$dir"
}

# Build siw.ko out of tree against the Debian headers.  Sets SIW_KO or
# SIW_REASON.  A failed compile is remembered (rm -r the kernel's cache dir to
# retry); a failed download is not.
siw_build() {
  SIW_KO='' SIW_REASON=''
  local out=$KDIR/siw.ko fail=$KDIR/siw.failed
  if [[ -f $out ]]; then SIW_KO=$out; return 0; fi
  if [[ -f $fail ]]; then SIW_REASON=$(cat "$fail"); return 0; fi

  local upstream=${KPKGVER%%-*} mm srcpkg srcver hpkg deps common kbuild
  mm=$(echo "$upstream" | cut -d. -f1-2)
  srcpkg=linux-source-$mm
  hpkg=linux-headers-$KVER
  # Prefer the kernel's exact version, then the same upstream release, then
  # the newest one apt has (madison lists newest first).
  srcver=$( { apt-cache madison "$srcpkg" 2>/dev/null || true; } | awk -F'|' '{gsub(/ /, "", $2); print $2}' |
    awk -v v="$KPKGVER" -v u="$upstream" '
      NR == 1 { newest = $0 }
      $0 == v { exact = $0 }
      index($0, u "-") == 1 && same == "" { same = $0 }
      END { print (exact != "" ? exact : (same != "" ? same : newest)) }')
  if [[ -z $srcver ]]; then SIW_REASON="apt has no $srcpkg"; return 0; fi
  deps=$( { apt-cache show "$hpkg=$KPKGVER" 2>/dev/null || true; } | sed -n 's/^Depends: //p' | head -n 1)
  common=$(grep -o 'linux-headers-[^ ,]*-common' <<< "$deps" | head -n 1 || true)
  kbuild=$(grep -o 'linux-kbuild-[^ ,]*' <<< "$deps" | head -n 1 || true)
  if [[ -z $deps || -z $common || -z $kbuild ]]; then
    SIW_REASON="apt has no $hpkg $KPKGVER (or its -common/kbuild dependencies)"; return 0
  fi

  vm_say "building siw.ko for $KVER (from $srcpkg $srcver)"
  local debs=$KDIR/siw-debs hdr=$KDIR/headers src=$KDIR/siw-src deb
  rm -rf "$debs" "$hdr" "$src"
  mkdir -p "$debs" "$hdr" "$src"
  if ! (cd "$debs" && apt_download "$hpkg=$KPKGVER" "$common=$KPKGVER" \
        "$kbuild=$KPKGVER" "$srcpkg=$srcver"); then
    rm -rf "$debs" "$hdr" "$src"
    SIW_REASON="downloading headers/source failed"; return 0
  fi
  local ok=1
  for deb in "$debs/$hpkg"_*.deb "$debs/$common"_*.deb "$debs/$kbuild"_*.deb; do
    dpkg-deb -x "$deb" "$hdr" || ok=0
  done
  # Only drivers/infiniband/sw/siw is needed from the ~140 MB source tarball.
  if ! dpkg-deb --fsys-tarfile "$debs/$srcpkg"_*.deb |
      tar -xO "./usr/src/$srcpkg.tar.xz" |
      tar -xJ -C "$src" --strip-components=5 "$srcpkg/drivers/infiniband/sw/siw"; then
    ok=0
  fi
  rm -rf "$debs"
  if (( ! ok )); then
    rm -rf "$hdr" "$src"
    SIW_REASON="unpacking headers/source failed"; return 0
  fi

  # The arch headers' Makefile includes the -common tree by absolute path
  # (/usr/src/...): point it into the cache.  scripts/ and tools/ are relative
  # symlinks into usr/lib/linux-kbuild-X.Y and resolve inside the cache as is.
  local kb=$hdr/usr/src/$hpkg esc
  esc=$(printf '%s' "$hdr" | sed 's/[&|\\]/\\&/g')
  sed -i "s|/usr/src/$common|$esc/usr/src/$common|g" "$kb/Makefile"
  if [[ ! -f $src/siw_main.c || ! -e $kb/scripts/Makefile.build ]]; then
    echo "siw sources or kbuild scripts missing after unpacking" > "$fail"
  # BTF for modules would need pahole (dwarves) and is of no use here.
  elif ! make -C "$kb" M="$src" -j"$(nproc)" CONFIG_RDMA_SIW=m CONFIG_DEBUG_INFO_BTF_MODULES= \
      modules > "$KDIR/siw-build.log" 2>&1 ||
       [[ ! -f $src/siw.ko ]]; then
    echo "siw build failed (log: $KDIR/siw-build.log)" > "$fail"
  else
    cp "$src/siw.ko" "$out.tmp" && mv "$out.tmp" "$out"
    SIW_KO=$out
    rm -rf "$hdr" "$src" # ~100 MB, only needed again for a new kernel
  fi
  [[ -f $fail ]] && SIW_REASON=$(cat "$fail")
  return 0
}

# Everything ci/vm needs before booting.  Concurrent callers serialize on a
# lock per kernel, so a cold cache is only filled once.
kernel_prepare() { # WANT_SIW(0|1)
  local lockfd
  mkdir -p "$VM_CACHE"
  kernel_resolve
  mkdir -p "$KDIR"
  exec {lockfd}> "$KDIR/.lock"
  flock "$lockfd"
  # Same ABI name, new Debian upload: start over.
  if [[ -f $KDIR/package && $(< "$KDIR/package") != "$KPKG $KPKGVER" ]]; then
    vm_say "$KVER changed to $KPKGVER; rebuilding its cache"
    find "$KDIR" -mindepth 1 -maxdepth 1 ! -name .lock -exec rm -rf {} +
  fi
  kernel_unpack
  kernel_extract_vmlinux
  initrd_build
  SIW_KO='' SIW_REASON='disabled (RDMA_VM_SIW=0)'
  if [[ $1 == 1 ]]; then siw_build; fi
  exec {lockfd}>&-
}
