"""Only the optional C extensions live here; pyproject.toml holds the metadata.

`optional=True`: without a C compiler the install prints setuptools' warning and
goes on, and each path falls back to its reference (sarpd/core/native.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "sarpd.core.verify._cverify",
            ["sarpd/core/verify/_cverify.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "sarpd.core._cwrite",
            ["sarpd/core/_cwrite.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
