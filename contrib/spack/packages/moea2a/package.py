# Spack package for moea2a. Copy this directory into a Spack repository
# (`spack repo create myrepo && cp -r packages/moea2a myrepo/packages/`) or point
# `spack repo add` at contrib/spack. tests/test_spack.sh checks that every variant
# maps to the configure flag it names.
from spack.package import *


class Moea2a(AutotoolsPackage, CudaPackage):
    """Expert-parallel all-to-all collectives for Mixture-of-Experts inference and
    training: dispatch, sanitize and combine over pluggable NCCL and UCX transports,
    with hwloc topology-aware workspace sizing and FP4/FP8 kernels."""

    homepage = "https://github.com/moea2a/moea2a"
    git = "https://github.com/moea2a/moea2a.git"
    url = "https://github.com/moea2a/moea2a/releases/download/v0.1.0/moea2a-0.1.0.tar.gz"

    license("BSD-3-Clause")

    # A release adds its tarball here: version("X.Y.Z", sha256="...").
    version("main", branch="main")

    variant("nccl", default=True, when="+cuda", description="NCCL transport module (CUDA memory; NCCL 2.28+)")
    variant("ucx", default=True, description="UCX transport module (host memory)")
    variant("mpi", default=False, description="Install moea2a_mpi.h (bootstrap from an MPI communicator) and test it")

    depends_on("c", type="build")
    depends_on("cxx", type="build", when="+cuda")  # nvcc's host compiler
    depends_on("pkgconfig", type="build")
    # A git checkout has no configure script yet.
    depends_on("autoconf", type="build", when="@main")
    depends_on("automake", type="build", when="@main")
    depends_on("libtool", type="build", when="@main")

    depends_on("hwloc@2:")
    depends_on("cuda@12.4:", when="+cuda")
    # The load/store path uses NCCL's device API (symmetric windows, LSA team): 2.28+.
    depends_on("nccl@2.28:", when="+nccl")
    depends_on("ucx", when="+ucx")
    depends_on("mpi", when="+mpi")

    # The kernels use sm_80 features (cp.async, bf16); sm_90 adds TMA bulk copies.
    for arch in CudaPackage.cuda_arch_values:
        if arch.isdigit() and int(arch) < 80:
            conflicts(f"cuda_arch={arch}", when="+cuda", msg="moea2a needs compute capability 8.0 or newer")

    def autoreconf(self, spec, prefix):
        which("sh")("./autogen.sh")

    def configure_args(self):
        spec = self.spec
        # Spack writes its own module files; moea2a's would point at the same prefix.
        args = ["--disable-modulefiles", "--with-hwloc=" + spec["hwloc"].prefix]
        if spec.satisfies("+cuda"):
            args.append("--with-cuda=" + spec["cuda"].prefix)
            archs = [a for a in spec.variants["cuda_arch"].value if a != "none"]
            if archs:
                args.append("--with-cuda-arch=" + " ".join(archs))
            if spec.satisfies("+nccl"):
                args.append("--with-nccl=" + spec["nccl"].prefix)
            else:
                args.append("--without-nccl")
        else:
            args += ["--without-cuda", "--without-nccl"]
        for name in ("ucx", "mpi"):
            if spec.satisfies("+" + name):
                args.append(f"--with-{name}=" + spec[name].prefix)
            else:
                args.append(f"--without-{name}")
        return args

    def check(self):
        # The multi-rank tests talk over loopback; GPU tests skip without a device.
        with working_dir(self.build_directory):
            make("check", parallel=False)
