"""Maps the top-level built-in folders to ``leanrl.environments``/``harnesses``/``runtimes``.

Everything else about the build is in pyproject.toml. Packages are found, not listed, so a new
subfolder with an ``__init__.py`` ships without anyone remembering to add it here.
"""

from setuptools import find_packages, setup

BUILTINS = ("environments", "harnesses", "runtimes")

packages = ["leanrl", *(f"leanrl.{p}" for p in find_packages("leanrl"))]
for folder in BUILTINS:
    packages += [f"leanrl.{folder}", *(f"leanrl.{folder}.{p}" for p in find_packages(folder))]

setup(
    packages=packages,
    package_dir={"leanrl": "leanrl", **{f"leanrl.{f}": f for f in BUILTINS}},
)
