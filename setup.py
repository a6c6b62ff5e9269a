"""Only the optional C extensions live here; pyproject.toml holds the metadata.

`optional=True`: without a C compiler the install prints setuptools' warning and
goes on, and sarpd.core.native falls back to each path's numpy/Python reference.
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
            "sarpd.core._cmatch",
            ["sarpd/core/_cmatch.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
