"""The one part of the build pyproject.toml cannot declare yet: drapps' C extension.

Region decode of JPEGs (drapps.ops.decode_crop), built against the system's libjpeg-turbo
(Debian: libjpeg62-turbo-dev). Optional: without a compiler or the headers the install goes on
and the op decodes the whole photo instead.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "drapps.ops._jpeg_region",
            sources=["src/drapps/ops/_jpeg_region.c"],
            libraries=["jpeg"],
            optional=True,
        )
    ]
)
