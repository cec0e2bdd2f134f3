"""The net a pretrained source states, set in the config before the net is built (zoo.app.pretrained): what the
config's net block does not state is the source's, nested classes included; a value or class it states that the source
contradicts is refused in one line naming each, whether or not it equals the class's default; a setting the family's
load adapts stays the config's; a path the family's rule does not read leaves the config alone."""

from __future__ import annotations

import pytest
from jsonargparse import Namespace

from zoo.app.pretrained import Source, net_from_source
from zoo.errors import InputError

AGENT = {"class_path": "zoo.rl.ActorCritic", "init_args": {"obs_dim": 4, "hidden_sizes": [8, 8], "continuous": False}}
TOWERS = {
    "class_path": "zoo.clip.CLIP",
    "init_args": {
        "image_encoder": {"class_path": "zoo.clip.VisionTransformer", "init_args": {"width": 32, "embed_dim": 16}},
        "text_encoder": {"class_path": "zoo.clip.TextTransformer", "init_args": {"width": 32, "embed_dim": 16}},
    },
}


def config(net: Namespace, path: str = "model_folder") -> Namespace:
    return Namespace(model=Namespace(init_args=Namespace(net=net, init_weights=path)))


def agent(**given) -> Namespace:
    """An ``ActorCritic`` block as the parser leaves it: every argument, at its default unless ``given``."""
    args = dict(obs_dim=None, action_dim=None, continuous=None, hidden_sizes=(64, 64), activation="tanh") | given
    return Namespace(class_path="zoo.rl.ActorCritic", init_args=Namespace(**args))


def stated(net: Namespace, *keys: str) -> Namespace:
    """What a config states of ``net`` (as ``zoo.app.parser``'s ``stated_config`` parses it): ``keys`` (dotted into a
    nested class) and its classes."""
    return config(_own(net, keys))


def _own(net: Namespace, keys) -> Namespace:
    own = Namespace(class_path=net.class_path, init_args=Namespace())
    for head in dict.fromkeys(key.partition(".")[0] for key in keys):
        value, rest = net.init_args[head], [k.partition(".")[2] for k in keys if k.startswith(head + ".")]
        own.init_args[head] = _own(value, rest) if isinstance(value, Namespace) else value
    return own


def test_the_defaults_are_the_sources_and_its_own_values_agree_or_are_refused_naming_each():
    source = Source(lambda path: AGENT)
    net = agent()
    assert "zoo.rl.ActorCritic" in net_from_source(config(net), source, stated(net))
    assert (net.init_args.obs_dim, net.init_args.hidden_sizes, net.init_args.activation) == (4, [8, 8], "tanh")
    net = agent(hidden_sizes=[8, 8], obs_dim=4)  # stated, and as the source says: kept
    net_from_source(config(net), source, stated(net, "hidden_sizes", "obs_dim"))
    named = r"obs_dim=3 \(the source's: 4\); .*hidden_sizes=\[16, 16\] \(the source's: \[8, 8\]\)"
    net = agent(hidden_sizes=(16, 16), obs_dim=3)
    with pytest.raises(InputError, match=named) as err:
        net_from_source(config(net), source, stated(net, "hidden_sizes", "obs_dim"))
    assert "\n" not in str(err.value)
    net = agent(hidden_sizes=(64, 64))  # the class's default, stated: the config's own all the same
    with pytest.raises(InputError, match=r"hidden_sizes=\[64, 64\] \(the source's: \[8, 8\]\)"):
        net_from_source(config(net), source, stated(net, "hidden_sizes"))
    net = agent(hidden_sizes=(16, 16), obs_dim=3)  # values the parser holds that the config does not state
    net_from_source(config(net), source, stated(net))
    assert (net.init_args.obs_dim, net.init_args.hidden_sizes) == (4, [8, 8])
    other = Namespace(class_path="zoo.rl.SoftActorCritic", init_args=Namespace())
    with pytest.raises(InputError, match=r"net\.class_path=zoo\.rl\.SoftActorCritic \(the source's: zoo\.rl\.Actor"):
        net_from_source(config(other), source, stated(other))


def test_nested_classes_are_the_sources_and_a_setting_the_load_adapts_stays_the_configs():
    source = Source(lambda path: TOWERS, adapted=frozenset({"embed_dim"}))
    net = Namespace(class_path="zoo.clip.CLIP", init_args=Namespace(image_encoder=None, text_encoder=None))
    net_from_source(config(net), source, stated(net))  # towers left out: built as the source states them
    assert net.init_args.image_encoder.class_path == "zoo.clip.VisionTransformer"
    assert net.init_args.text_encoder.init_args.width == 32
    vit = Namespace(class_path="zoo.clip.VisionTransformer", init_args=Namespace(width=64, embed_dim=512))
    net = Namespace(class_path="zoo.clip.CLIP", init_args=Namespace(image_encoder=vit, text_encoder=None))
    own = stated(net, "image_encoder.width", "image_encoder.embed_dim")
    with pytest.raises(InputError, match=r"image_encoder\.init_args\.width=64 \(the source's: 32\)\. Leave"):
        net_from_source(config(net), source, own)
    vit.init_args.width, vit.init_args.embed_dim = 32, 64  # another joint space: its projection is replaced
    net_from_source(config(net), source, stated(net, "image_encoder.width", "image_encoder.embed_dim"))
    assert vit.init_args.embed_dim == 64
    convnet = Namespace(class_path="zoo.cnn.ConvNet", init_args=Namespace())
    net = Namespace(class_path="zoo.clip.CLIP", init_args=Namespace(image_encoder=convnet, text_encoder=None))
    with pytest.raises(InputError, match=r"image_encoder=zoo\.cnn\.ConvNet \(the source's: zoo\.clip\.Vision"):
        net_from_source(config(net), source, stated(net, "image_encoder"))


def test_a_path_the_rule_does_not_read_or_no_rule_leaves_the_config_alone():
    net = agent(hidden_sizes=[16, 16])
    assert net_from_source(config(net), Source(lambda path: None)) is None  # a weights file, a zoo checkpoint
    assert net_from_source(config(net), None) is None  # a family without a rule
    url = config(net, "https://example.com/agent.zip")
    assert net_from_source(url, Source(lambda path: AGENT)) is None  # a URL: not read here
    assert net.init_args.hidden_sizes == [16, 16]
