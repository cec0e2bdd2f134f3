"""The stored-config allowlist looks a class path up when a stored config names it (zoo.io.trust.zoo_class): it
imports the one module of ours that the path names, found as a file of a family package, and nothing at start; a
path that names anything else is refused without an import."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

from zoo.errors import MissingExtra
from zoo.io import build, trust


def test_making_the_allowlist_imports_no_family_and_a_lookup_imports_only_the_module_it_names():
    code = (
        "import sys\n"
        "from zoo.io.trust import zoo_allowlist\n"
        "allow = zoo_allowlist()\n"
        "before = {m for m in sys.modules if m.startswith('zoo.')}\n"
        "assert allow.parts['zoo.cnn.convnet.ConvNet'].__name__ == 'ConvNet'\n"
        "after = {m for m in sys.modules if m.startswith('zoo.')}\n"
        "print(sorted(before)); print(sorted(after))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = (eval(line) for line in proc.stdout.splitlines())  # two lists of module names
    families = ("zoo.gpt", "zoo.diffusion", "zoo.clip", "zoo.cnn", "zoo.rl")
    assert not [m for m in before if m.startswith(families)], before
    assert "zoo.cnn.convnet" in after and not [m for m in after if m.startswith(families) and "cnn" not in m], after


@pytest.mark.parametrize(
    "path",
    [
        "zoo.gpt.no_such_module.GPT",  # no file of the package
        "zoo.gpt.gpt.torch",  # a module a module imported, not a class
        "zoo.gpt.gpt.nn.Linear",  # a path through a module's imports
        "zoo.gpt.module.GPT",  # a class by the path of a module that imported it, not the one defining it
        "zoo.gptx.GPT",  # a package whose name only starts with a family's
        "zoo.cnn.torchvision_net.nn",
        "zoo.gpt..GPT",
        "zoo.gpt.GPT\n",
    ],
)
def test_a_path_that_names_no_class_a_family_file_defines_is_refused_before_any_import(path):
    allow = trust.zoo_allowlist()
    assert allow.parts.get(path) is None and path not in allow.modules
    with pytest.raises(trust.UntrustedConfigError, match="not one of the zoo's modules"):
        build.resolve_model({"_class_path": path}, "planted.ckpt", allow)


def test_a_class_is_named_where_it_is_defined_and_where_its_package_exports_it():
    from zoo.gpt import GPT, CausalLMModule

    allow = trust.zoo_allowlist()
    assert allow.parts["zoo.gpt.GPT"] is allow.parts["zoo.gpt.gpt.GPT"] is GPT
    assert allow.modules["zoo.gpt.CausalLMModule"] is CausalLMModule and "zoo.gpt.GPT" not in allow.modules
    assert allow.parts["zoo.diffusion.DDIMSampler"].__name__ == "DDIMSampler"  # a part by its base, not nn.Module
    assert set(allow.parts) >= {"zoo.gpt.GPT", "zoo.gpt.gpt.GPT"}  # a listing has them too


def test_a_stored_path_into_a_module_whose_extra_is_missing_is_one_line_naming_the_extra(monkeypatch):
    for name in ["lm_eval", *(m for m in sys.modules if m.startswith("lm_eval."))]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "zoo.gpt.lm_eval", raising=False)
    with pytest.raises(MissingExtra, match=r'lm-eval, which is not installed: pip install -c constraints.txt -e "\.\['):
        build.resolve_model({"_class_path": "zoo.gpt.lm_eval.ZooLM"}, "planted.ckpt", trust.zoo_allowlist())
