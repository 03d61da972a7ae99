"""Loads contrib/spack/packages/moea2a/package.py against a stand-in for Spack's
`spack.package` module (directives recorded, a spec built from variant settings),
so that tests can call configure_args() without Spack installed. Usage:
    spack_stub.py PACKAGE.py [name=value ...]  -> prints the configure flags, one per line
    spack_stub.py PACKAGE.py --variants       -> prints the declared variants
Prefixes of dependencies are /deps/<name> unless DEPS_<NAME> says otherwise."""
import os
import sys
import types

directives = {"variant": [], "depends_on": [], "conflicts": [], "version": []}


def _record(kind):
    def directive(*args, **kwargs):
        directives[kind].append((args, kwargs))
    return directive


class _Dep:
    def __init__(self, name):
        self.prefix = os.environ.get("DEPS_" + name.upper(), "/deps/" + name)


class _Variant:
    def __init__(self, value):
        self.value = value


class Spec:
    """Enough of spack.spec.Spec: satisfies("+v") / ("~v"), variants[...], spec[dep]."""
    def __init__(self, settings):
        self.settings = settings

    def satisfies(self, text):
        name = text[1:]
        if name not in self.settings:
            return False
        on = self.settings[name] in (True, "True", "true")
        return on if text[0] == "+" else not on

    @property
    def variants(self):
        return {k: _Variant(tuple(v.split(",")) if k == "cuda_arch" else v) for k, v in self.settings.items()}

    def __getitem__(self, dep):
        return _Dep(dep)


class AutotoolsPackage:
    build_directory = "."


class CudaPackage:
    cuda_arch_values = ("50", "60", "70", "75", "80", "86", "89", "90", "90a", "100", "100a", "120")


def _noop(*args, **kwargs):
    return None


stub = types.ModuleType("spack.package")
for name in directives:
    setattr(stub, name, _record(name))
stub.license = stub.maintainers = _noop
stub.AutotoolsPackage, stub.CudaPackage = AutotoolsPackage, CudaPackage
stub.which = stub.working_dir = stub.make = _noop
sys.modules["spack"] = types.ModuleType("spack")
sys.modules["spack.package"] = stub

path = sys.argv[1]
code = compile(open(path).read(), path, "exec")
namespace = {}
exec(code, namespace)
pkg_class = namespace["Moea2a"]

if sys.argv[2:] == ["--variants"]:
    for args, kwargs in directives["variant"]:
        print(args[0], kwargs.get("when", ""))
    sys.exit(0)

settings = {"cuda": False, "cuda_arch": "none"}
for arg in sys.argv[2:]:
    key, value = arg.split("=", 1)
    settings[key] = value if key == "cuda_arch" else value in ("1", "true", "True", "yes")
pkg = pkg_class.__new__(pkg_class)
pkg.spec = Spec(settings)
for flag in pkg.configure_args():
    print(flag)
