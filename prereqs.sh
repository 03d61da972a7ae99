#!/bin/sh
# What building moea2a from a git checkout needs, installed where it is missing: a C
# compiler and make, autoconf, automake, libtool, pkg-config, hwloc and UCX with their
# headers, and for the tests NumPy and pytest (the Python package's) and Open MPI (the
# MPI bootstrap's). Run as root on Debian, Ubuntu, Fedora or RHEL it installs them with
# the system's package manager; otherwise it prints the exact command that would, and
# fails. With everything found it does nothing. Optional parts (CUDA, NCCL) are for
# configure to find: see README.md.
set -u

have() { command -v "$1" >/dev/null 2>&1; }
have_pc() { have pkg-config && pkg-config --exists "$1" 2>/dev/null; }
have_py() { have python3 && python3 -c "import $1" 2>/dev/null; }

# package names per family of systems (words without spaces: add splits them)
if have apt-get; then
    pm="apt-get install -y -qq"
    cc=build-essential; at="autoconf automake libtool"; pc=pkg-config; hw=libhwloc-dev; ucx=libucx-dev
    py="python3 python3-numpy python3-pytest"; mpi="libopenmpi-dev openmpi-bin"
elif have dnf || have yum; then
    pm="$(have dnf && echo dnf || echo yum) install -y"
    cc="gcc make"; at="autoconf automake libtool"; pc=pkgconf-pkg-config; hw=hwloc-devel; ucx="ucx-devel"
    py="python3 python3-numpy python3-pytest"; mpi=openmpi-devel
else
    pm=""
    cc="cc make"; at="autoconf automake libtool"; pc=pkg-config; hw="hwloc(with-headers)"; ucx="ucx(with-headers)"
    py="python3-numpy python3-pytest"; mpi="openmpi"
fi

missing=""
add() { for p in "$@"; do case " $missing " in *" $p "*) ;; *) missing="$missing $p" ;; esac; done; }
# shellcheck disable=SC2086 # each list is words to add one by one
{
    { have cc && have make; } || add $cc
    { have autoreconf && have automake && { have libtoolize || have glibtoolize; }; } || add $at
    have pkg-config || add $pc
    have_pc hwloc || add $hw
    have_pc ucx || add $ucx
    { have_py numpy && have_py pytest; } || add $py
    have mpicc || add $mpi
}

if [ -z "$missing" ]; then
    echo "prereqs.sh: every prerequisite is installed"
    exit 0
fi
echo "prereqs.sh: missing:$missing"
if [ -z "$pm" ]; then
    echo "prereqs.sh: no apt-get, dnf or yum here: install those with this system's package manager" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "prereqs.sh: run as root, or install them yourself:" >&2
    echo "  sudo $pm$missing" >&2
    exit 1
fi
case $pm in apt-get*) DEBIAN_FRONTEND=noninteractive apt-get update -qq || exit 1 ;; esac
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive $pm$missing || { echo "prereqs.sh: '$pm$missing' failed" >&2; exit 1; }
echo "prereqs.sh: installed$missing"
