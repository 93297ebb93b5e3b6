"""Render the Kubernetes kit's kustomizations offline, without kustomize or kubectl.

Only the part of kustomize the kit uses is understood, and anything beyond it is refused
rather than rendered differently: ``resources`` (files, or directories with their own
kustomization), ``patches`` given as a file of JSON patch operations (RFC 6902, applied by the
``jsonpatch`` library) with a ``target`` of kind and name, and ``images`` with a new name, tag
or digest. When ``kubectl`` is installed, a test compares this rendering with
``kubectl kustomize``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonpatch
import yaml

KIT = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
OVERLAYS = ("dev", "production")

Manifest = dict[str, Any]

_FIELDS = {"apiVersion", "kind", "resources", "patches", "images"}
_PATCH_FIELDS = {"path", "target"}
_TARGET_FIELDS = {"kind", "name"}
_IMAGE_FIELDS = {"name", "newName", "newTag", "digest"}


class UnsupportedKustomization(ValueError):
    """The kustomization uses something this renderer does not implement."""


def overlay(name: str) -> list[Manifest]:
    return render(KIT / "overlays" / name)


def render(directory: Path) -> list[Manifest]:
    kustomization = _load_mapping(directory / "kustomization.yaml")
    _refuse_unknown(kustomization, _FIELDS, directory / "kustomization.yaml")
    manifests: list[Manifest] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        manifests.extend(render(path) if path.is_dir() else load_manifests(path))
    for patch in kustomization.get("patches", []):
        manifests = _apply_patch(manifests, directory, patch)
    for image in kustomization.get("images", []):
        _refuse_unknown(image, _IMAGE_FIELDS, directory / "kustomization.yaml")
        for manifest in manifests:
            _set_image(manifest, image)
    _refuse_duplicates(manifests)
    return manifests


def load_manifests(path: Path) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def identity(manifest: Manifest) -> tuple[str, str]:
    return manifest["kind"], manifest["metadata"]["name"]


def _load_mapping(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text())
    if not isinstance(loaded, dict):
        raise UnsupportedKustomization(f"{path}: not a mapping")
    return loaded


def _refuse_unknown(mapping: dict[str, Any], known: set[str], where: Path) -> None:
    unknown = set(mapping) - known
    if unknown:
        raise UnsupportedKustomization(f"{where}: {sorted(unknown)} not understood offline")


def _apply_patch(
    manifests: list[Manifest], directory: Path, patch: dict[str, Any]
) -> list[Manifest]:
    where = directory / "kustomization.yaml"
    _refuse_unknown(patch, _PATCH_FIELDS, where)
    target = patch["target"]
    _refuse_unknown(target, _TARGET_FIELDS, where)
    operations = yaml.safe_load((directory / patch["path"]).read_text())
    if not isinstance(operations, list):
        raise UnsupportedKustomization(f"{patch['path']}: not a list of JSON patch operations")
    wanted = (target["kind"], target["name"])
    matches = [i for i, manifest in enumerate(manifests) if identity(manifest) == wanted]
    if len(matches) != 1:
        raise UnsupportedKustomization(f"{patch['path']}: {wanted} matches {len(matches)}")
    patched = list(manifests)
    patched[matches[0]] = jsonpatch.apply_patch(manifests[matches[0]], operations)
    return patched


def _set_image(node: Any, image: dict[str, str]) -> None:
    """Kustomize's image rule: every container whose image has this name, in any pod
    template, gets the new name, tag or digest."""
    if isinstance(node, list):
        for item in node:
            _set_image(item, image)
        return
    if not isinstance(node, dict):
        return
    for key in ("containers", "initContainers"):
        for container in node.get(key, []):
            name, tag, digest = _split_image(container["image"])
            if name != image["name"]:
                continue
            name = image.get("newName", name)
            if "digest" in image:
                container["image"] = f"{name}@{image['digest']}"
            else:
                tag = image.get("newTag", tag)
                container["image"] = name + (f":{tag}" if tag else "") + (digest or "")
    for value in node.values():
        _set_image(value, image)


def _split_image(image: str) -> tuple[str, str | None, str | None]:
    """``registry/name:tag@digest`` -> (``registry/name``, tag, ``@digest``)."""
    rest, at, digest = image.partition("@")
    name, colon, tag = rest.rpartition(":")
    if not colon or "/" in tag:  # no tag; the colon belonged to a registry's port
        name, tag = rest, ""
    return name, tag or None, f"@{digest}" if at else None


def _refuse_duplicates(manifests: list[Manifest]) -> None:
    seen: set[tuple[str, str]] = set()
    for manifest in manifests:
        if identity(manifest) in seen:
            raise UnsupportedKustomization(f"{identity(manifest)} appears twice")
        seen.add(identity(manifest))
