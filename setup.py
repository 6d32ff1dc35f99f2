"""Package list for setuptools; all other metadata lives in pyproject.toml.

The repository keeps three source folders, installed under one namespace:
``flashlight/`` -> ``flashlight``, ``integrations/`` -> ``flashlight.integrations``,
``structures/`` -> ``flashlight.structures`` (see ``package-dir`` in pyproject.toml).
"""
from setuptools import find_packages, setup

FOLDERS = {
    "flashlight": "flashlight",
    "flashlight.integrations": "integrations",
    "flashlight.structures": "structures",
}


def packages() -> list[str]:
    found = []
    for package, folder in FOLDERS.items():
        found.append(package)
        found.extend(f"{package}.{sub}" for sub in find_packages(where=folder))
    return sorted(set(found))


setup(packages=packages())
