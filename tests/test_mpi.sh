#!/bin/sh
# moea2a_comm_init_mpi (header-only, moea2a_mpi.h) built with mpicc and run under
# mpirun with 2 and 3 ranks. Skipped where MPI was not configured or mpirun cannot
# start processes at all on this machine.
echo "1..2"
if [ -z "$MPICC" ] || [ -z "$MPIRUN" ]; then
    echo "ok 1 # SKIP MPI not configured"; echo "ok 2 # SKIP MPI not configured"; exit 0
fi
run="$MPIRUN --allow-run-as-root --oversubscribe --mca btl self,vader --mca plm_rsh_agent false"
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ! timeout 60 $run -np 1 true >/dev/null 2>&1; then
    echo "ok 1 # SKIP mpirun cannot start processes here"; echo "ok 2 # SKIP mpirun cannot start processes here"; exit 0
fi
exe=./tests/mpi_init_prog
# The library's own flags too, so a sanitizer build links the program the same way.
$MPICC $BUILD_CFLAGS $BUILD_LDFLAGS -I"$top_srcdir/include" -I"$top_builddir/include" "$top_srcdir/tests/mpi_init.c" -o $exe \
    -L"$top_builddir/lib/.libs" -lmoea2a -Wl,-rpath,"$top_builddir/lib/.libs" || { echo "not ok 1 - mpicc build"; exit 1; }
i=0; rc=0
for np in 2 3; do
    i=$((i + 1))
    if timeout 120 $run -np $np -x MOEA2A_TRANSPORT_PATH -x MOEA2A_SOCKET_IFNAME -x UCX_TLS $exe; then
        echo "ok $i - moea2a_comm_init_mpi under mpirun -np $np"
    else
        echo "not ok $i - moea2a_comm_init_mpi under mpirun -np $np"; rc=1
    fi
done
rm -f $exe
exit $rc
