#!/bin/sh
# The Python package (python/) against this build: pytest over its tests (NumPy on
# host memory, 1-4 forked ranks; the ctypes structs against moea2a.h), each pytest
# result one TAP line; and the package's version is the library's. TAP.
src=${top_srcdir:-.}; build=${top_builddir:-.}
py=${PYTHON:-python3}
lib="$build/lib/.libs/libmoea2a.so.1"
if ! command -v "$py" >/dev/null 2>&1 || ! "$py" -c "import numpy, pytest" 2>/dev/null; then
    echo "1..0 # SKIP python3 with numpy and pytest is needed (pip install numpy pytest)"; exit 0
fi
if [ ! -f "$lib" ]; then echo "1..0 # SKIP no shared library in this build"; exit 0; fi
# a library built with ASan/UBSan needs its runtime loaded first, which a Python
# interpreter does not do
if objdump -p "$lib" 2>/dev/null | grep -qE 'NEEDED +lib(asan|ubsan)'; then
    echo "1..0 # SKIP the library is built with sanitizers"; exit 0
fi
out=$(MOEA2A_LIBRARY="$lib" MOEA2A_INCLUDE="$src/include:$build/include" PYTHONPATH="$src/python" \
      PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -p no:cacheprovider -q -rA "$src/python/tests" 2>&1)
rc=$?
n=0
results=$(mktemp)
printf '%s\n' "$out" | grep -E '^(PASSED|FAILED|SKIPPED|ERROR) ' >"$results"
# no result lines at all (pytest did not run its tests) is a failure too
[ -s "$results" ] || echo "ERROR pytest-ran-nothing (rc $rc)" >"$results"
while read -r status name rest; do
    n=$((n + 1))
    case $status in
        PASSED) echo "ok $n - $name" ;;
        SKIPPED) echo "ok $n - $name $rest # SKIP" ;;
        *) echo "not ok $n - $name $rest" ;;
    esac
done <"$results"
rm -f "$results"
n=$((n + 1))
want=$(sed -n 's/^AC_INIT(\[moea2a\], \[\([^]]*\)\].*/\1/p' "$src/configure.ac")
have=$(sed -n 's/^version = "\(.*\)"/\1/p' "$src/python/pyproject.toml")
[ -n "$want" ] && [ "$want" = "$have" ] && echo "ok $n - python/pyproject.toml has the library's version ($have)" ||
    echo "not ok $n - python/pyproject.toml has version '$have', the library '$want'"
if [ "$rc" -ne 0 ] && ! printf '%s\n' "$out" | grep -qE '^(FAILED|ERROR) '; then
    n=$((n + 1)); echo "not ok $n - pytest failed (rc $rc)"; printf '%s\n' "$out" | tail -20 | sed 's/^/# /'
fi
echo "1..$n"
