"""Release builds deploy images by digest (docs/operations.md, "Images by digest"): the
documented kustomization, rendered over this deploy/, pins every container image of the
base by its digest and leaves no tag."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from tests.deploy.manifests import DEPLOY, REPO, kustomizations, pod_templates, render

DOC = REPO / "docs" / "operations.md"


def documented_release_kustomization() -> str:
    """The ``yaml`` block of the doc's section "Images by digest"."""
    section = DOC.read_text().split('<a id="images-by-digest"></a>', 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block, "docs/operations.md, Images by digest, has no yaml block"
    return block.group(1)


def images(objects: tuple[dict[str, object], ...]) -> set[str]:
    found = set()
    for _, template in pod_templates(list(objects)):  # type: ignore[arg-type]
        spec = template["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            found.add(c["image"])
    return found


def test_the_documented_release_kustomization_pins_every_image_by_digest(tmp_path: Path) -> None:
    text = documented_release_kustomization()
    kustomization = yaml.safe_load(text)
    assert kustomization["resources"] == ["../deploy"]
    release = tmp_path / "my-release"
    release.mkdir()
    # The doc's directory sits next to deploy/; kustomize takes relative paths only.
    kustomization["resources"] = [os.path.relpath(DEPLOY, release)]
    (release / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    rendered = images(render(release))
    assert rendered, "no container image in the render"
    for image in rendered:
        assert re.fullmatch(r"[^:@]+(:[0-9]+)?[^:@]*@sha256:[0-9a-f]{64}", image), image
    # Every image the base deploys has its entry in the doc.
    names = {entry["name"] for entry in kustomization["images"]}
    base_images = {
        re.split(r"[:@]", image)[0] for image in images(render(kustomizations()["base"]))
    }
    assert base_images <= names, base_images - names
