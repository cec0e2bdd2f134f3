"""YAML read with a bound on what its aliases expand to: an alias bomb ("billion laughs", nine lists of nine aliases
to the list before) is a few hundred bytes that PyYAML composes as a small graph of shared nodes, and that every reader
walking it as a tree (jsonargparse copies it, the allowlist checks it) expands to 10**9 values: memory or hours."""

from __future__ import annotations

from typing import Any

import yaml

from zoo.errors import InputError

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # what yaml.safe_load is, in C where PyYAML has it
MAX_EXPANDED_NODES = 1_000_000  # a real config is hundreds of values; a long list of class names, thousands


def check_alias_expansion(text: str, where: str = "YAML") -> None:
    """Refuse ``text`` when its aliases expand it past ``MAX_EXPANDED_NODES`` values, or into itself (a recursive
    alias). Composed with PyYAML's own composer (the node graph, before any value is built), so the reader that
    loads it next sees the same structure; text that does not compose is left to that reader's own error."""
    loader = LOADER(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError:
        return
    finally:
        loader.dispose()
    if node is not None and _expanded_size(node, where) > MAX_EXPANDED_NODES:
        raise InputError(
            f"{where}: its aliases (*name) expand it past {MAX_EXPANDED_NODES:,} values (a YAML alias bomb?): write "
            f"the repeated values out, or repeat them fewer times"
        )


def _expanded_size(root: yaml.Node, where: str) -> int:
    """The values in ``root`` with every alias expanded (capped just past the bound), each shared node counted once
    per use but walked once; iterative, so that a deep document does not reach Python's recursion limit."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # nodes whose children are being counted: meeting one again is a recursive alias
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_counted = stack.pop()
        if children_counted:
            open_.discard(id(node))
            sizes[id(node)] = min(1 + sum(sizes[id(k)] for k in _children(node)), MAX_EXPANDED_NODES + 1)
        elif id(node) in open_:
            raise InputError(f"{where}: an alias refers to the value that holds it (a recursive YAML alias)")
        elif id(node) not in sizes:
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((k, False) for k in _children(node))
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def safe_load(text: str, where: str = "YAML") -> Any:
    """``yaml.safe_load(text)`` once its aliases are known to expand to a bounded document."""
    check_alias_expansion(text, where)
    return yaml.load(text, Loader=LOADER)
