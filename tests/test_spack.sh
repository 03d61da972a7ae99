#!/bin/sh
# The Spack package (contrib/spack) parses, declares the variants the packaging issue
# asks for, and maps each of them to the configure flag it names; every flag it emits
# is one this configure knows. Spack itself is not needed (tests/spack_stub.py). TAP.
src=${top_srcdir:-.}
pkg="$src/contrib/spack/packages/moea2a/package.py"
n=0
check() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi; }
if ! command -v python3 >/dev/null 2>&1; then echo "1..0 # SKIP no python3"; exit 0; fi
echo "1..8"
python3 -c "import ast, sys; ast.parse(open(sys.argv[1]).read())" "$pkg"
check $? "package.py parses"
stub() { python3 "$src/tests/spack_stub.py" "$pkg" "$@"; }
variants=$(stub --variants | awk '{print $1}' | sort | tr '\n' ' ')
[ "$variants" = "mpi nccl ucx " ]; check $? "variants nccl, ucx, mpi declared (cuda, cuda_arch from CudaPackage): $variants"

has() { printf '%s\n' "$1" | grep -qxF -- "$2"; }
cpu=$(stub cuda=0 ucx=1 mpi=0)
has "$cpu" "--without-cuda" && has "$cpu" "--without-nccl" && has "$cpu" "--with-ucx=/deps/ucx" &&
    has "$cpu" "--without-mpi" && has "$cpu" "--with-hwloc=/deps/hwloc" && has "$cpu" "--disable-modulefiles"
check $? "~cuda +ucx ~mpi -> --without-cuda --without-nccl --with-ucx=PREFIX --without-mpi"
gpu=$(stub cuda=1 nccl=1 ucx=0 mpi=1 cuda_arch=90)
has "$gpu" "--with-cuda=/deps/cuda" && has "$gpu" "--with-nccl=/deps/nccl" && has "$gpu" "--without-ucx" &&
    has "$gpu" "--with-mpi=/deps/mpi" && has "$gpu" "--with-cuda-arch=90" && ! has "$gpu" "--without-cuda"
check $? "+cuda +nccl ~ucx +mpi cuda_arch=90 -> --with-cuda=PREFIX --with-nccl=PREFIX --with-cuda-arch=90 --without-ucx --with-mpi=PREFIX"
gpu2=$(stub cuda=1 nccl=0 ucx=1 mpi=0 cuda_arch=90,100)
has "$gpu2" "--without-nccl" && has "$gpu2" "--with-cuda-arch=90 100"
check $? "+cuda ~nccl cuda_arch=90,100 -> --without-nccl --with-cuda-arch=\"90 100\""
noarch=$(stub cuda=1 nccl=1 ucx=1 mpi=0 cuda_arch=none)
! printf '%s\n' "$noarch" | grep -q -- "--with-cuda-arch"
check $? "+cuda cuda_arch=none leaves the arch list to configure's default"

# Every option the package passes is one configure declares (a renamed option fails here).
norm() { sed -e 's/=.*//' -e 's/^--without-/--with-/' -e 's/^--disable-/--enable-/'; }
declared=$(sh "$src/configure" --help 2>/dev/null | grep -oE -- '--(with|without|enable|disable)-[A-Za-z0-9_-]+' | norm | sort -u)
unknown=""
for flag in $cpu $gpu; do
    opt=$(printf '%s\n' "$flag" | norm)
    printf '%s\n' "$declared" | grep -qxF -- "$opt" || unknown="$unknown $flag"
done
[ -n "$declared" ] && [ -z "$unknown" ]; check $? "configure --help knows every flag the package emits${unknown:+ (unknown:$unknown)}"
# ...and the check is not vacuous: an option configure lacks is not in the list.
[ -n "$declared" ] && ! printf '%s\n' "$declared" | grep -qxF -- "--with-nonexistent-thing" &&
    printf '%s\n' "$declared" | grep -qxF -- "--with-cuda-arch"
check $? "the declared-option list has --with-cuda-arch and not an invented option"
