"""The optional C extensions live here; pyproject.toml holds the metadata.

`optional=True`: without a C compiler the install prints setuptools' warning and
goes on, and each path runs its reference (sarpd/core/native.py). Native hashing
(`_chash`) links the system's libxxhash (Debian: libxxhash-dev) and is built only
when the compiler finds it (`native.xxhash_found`); without it the install says so
and goes on.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import Extension, setup


def _native():  # sarpd/core/native.py (standard library only), without importing sarpd
    path = Path(__file__).resolve().parent / "sarpd" / "core" / "native.py"
    spec = importlib.util.spec_from_file_location("_sarp_native", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


ext_modules = [
    Extension(
        "sarpd.core.verify._cverify",
        ["sarpd/core/verify/_cverify.c"],
        include_dirs=["sarpd/core/csrc"],
        depends=["sarpd/core/csrc/sarp.h"],
        extra_compile_args=["-O2"],
        optional=True,
    ),
    Extension(
        "sarpd.core._cmatch",
        ["sarpd/core/_cmatch.c", "sarpd/core/csrc/holders.c", "sarpd/core/csrc/rounds.c",
         "sarpd/core/csrc/segcache.c", "sarpd/core/csrc/segment.c"],
        include_dirs=["sarpd/core/csrc"],
        depends=["sarpd/core/csrc/holders.h", "sarpd/core/csrc/rounds.h", "sarpd/core/csrc/sarp.h",
                 "sarpd/core/csrc/segcache.h", "sarpd/core/csrc/segment.h"],
        extra_compile_args=["-O2"],
        optional=True,
    ),
    Extension(
        "sarpd.core._cwrite",
        ["sarpd/core/_cwrite.c", "sarpd/core/csrc/segment.c"],
        include_dirs=["sarpd/core/csrc"],
        depends=["sarpd/core/csrc/segment.h", "sarpd/core/csrc/sarp.h"],
        extra_compile_args=["-O2"],
        optional=True,
    ),
    Extension(
        "sarpd.core._cmap",
        ["sarpd/core/_cmap.c", "sarpd/core/csrc/blockmap.c"],
        include_dirs=["sarpd/core/csrc"],
        depends=["sarpd/core/csrc/blockmap.h"],
        extra_compile_args=["-O2"],
        optional=True,
    ),
    Extension(
        "sarpd.core._cdir",
        ["sarpd/core/_cdir.c", "sarpd/core/csrc/directory.c"],
        include_dirs=["sarpd/core/csrc"],
        depends=["sarpd/core/csrc/directory.h", "sarpd/core/csrc/sarp.h"],
        extra_compile_args=["-O2"],
        optional=True,
    ),
]
if _native().xxhash_found():
    ext_modules.append(
        Extension(
            "sarpd.core._chash",
            ["sarpd/core/_chash.c"],
            include_dirs=["sarpd/core/csrc"],
            depends=["sarpd/core/csrc/sarp.h"],
            libraries=["xxhash"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    )
else:
    print("sarp: xxhash.h / libxxhash not found (Debian: apt-get install libxxhash-dev): "
          "native hashing (sarpd.core._chash) NOT built; ids use the Python reference",
          file=sys.stderr)

setup(ext_modules=ext_modules)
