"""Only the optional C verifier lives here; pyproject.toml holds the metadata.

`optional=True`: without a C compiler the install prints setuptools' warning and
goes on, and sarpd.core.verify falls back to numpy.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "sarpd.core.verify._cverify",
            ["sarpd/core/verify/_cverify.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
