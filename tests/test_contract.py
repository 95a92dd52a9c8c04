"""The mechanism contract and the one parameter declaration."""
import dataclasses
import inspect

import pytest

from beam_dpsu.transforms.expansion import expand_mechanism
import beam_dpsu.transforms.select  # noqa: F401  (registers every family's expansion)

from beam_dpsu.dp.mechanisms.base import run_local
from beam_dpsu.dp.privacy import params
from beam_dpsu.dp.mechanisms import Mechanism
from beam_dpsu.dp.mechanisms.base import ThresholdMechanism
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.mechanisms.registry import REGISTRY, MechanismParams, make_mechanism
from beam_dpsu.dp.mechanisms.topk import TopKMechanism
from beam_dpsu.pipelines import arguments, compare


def _built():
    out = []
    for name, entry in sorted(REGISTRY.items()):
        kwargs = {"epsilon": 1.0, "delta": 1e-5}
        if "public_counts" in entry.accepts:
            continue  # needs a file; GWKT is covered by test_pinned_releases
        out.append(make_mechanism(name, **kwargs))
    return out + [TopKMechanism(3, 1.0, 1e-5)]


@pytest.mark.parametrize("mechanism", _built(), ids=lambda m: m.name)
def test_every_mechanism_fulfils_the_contract(mechanism):
    assert isinstance(mechanism, Mechanism)
    assert type(mechanism).run_local is not Mechanism.run_local
    # its family's Beam expansion is registered (importing transforms.select registers all)
    assert expand_mechanism.dispatch(type(mechanism)) is not expand_mechanism.dispatch(Mechanism)
    rule = inspect.signature(type(mechanism).release_rule)
    assert list(rule.parameters) == ["self", "run_key", "round_index"]
    assert rule.parameters["round_index"].default == 0
    mechanism.describe()
    # base.run_local takes ids of any accepted type and runs the mechanism on their
    # canonical forms: numpy ids release what the plain ints and strings release
    import numpy as np
    plain = {i: {"a": 1, f"own{i}": 1} for i in range(50)}
    numpy_ids = {np.int64(i): {np.str_(item): n for item, n in c.items()}
                 for i, c in plain.items()}
    key = RunKey.from_test_seed(4)
    released = run_local(numpy_ids, mechanism, key)
    assert released == mechanism.run_local(plain, key)
    # and refuses the ids whose keyed hash would differ from Python's equality
    from beam_dpsu.dp.data.contribution import IdTypeError
    with pytest.raises(IdTypeError, match="float"):
        run_local(dict(plain, **{"x": {1.5: 1}}), mechanism, key)


def test_threshold_mechanisms_release_what_their_rule_keeps():
    m = make_mechanism("weighted-laplace", epsilon=1.0, delta=1e-5)
    assert isinstance(m, ThresholdMechanism)
    per_user = {f"u{i}": {"a": 1, "b": 1} for i in range(40)}
    key = RunKey.from_test_seed(5)
    rule = m.release_rule(key)
    assert m.run_local(per_user, key) == {
        item for item, w in m.histogram_local(per_user, key).items() if rule(item, w)}


def test_core_run_local_dispatches_by_method_only():
    source = inspect.getsource(run_local)
    assert "isinstance" not in source and "getattr" not in source


def test_mechanism_params_are_the_declared_parameters():
    assert [f.name for f in dataclasses.fields(MechanismParams)] == list(params.MECHANISM_PARAMS)
    for entry in REGISTRY.values():
        assert entry.accepts <= set(params.MECHANISM_PARAMS), entry.name
    with pytest.raises(ValueError, match="undeclared"):
        from beam_dpsu.dp.mechanisms.registry import register
        register("bogus", lambda p: None, {"nope"}, "")
    assert "bogus" not in REGISTRY


def _flags(parser):
    return {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}


def test_every_tool_builds_its_flags_from_the_declaration():
    declared = {n: p.cli_flag for n, p in params.ALL_PARAMS.items()}
    for parser, names in [
            (arguments.select_parser(), list(params.MECHANISM_PARAMS)),
            (arguments.top_k_parser(), ["k", "k_bar", "epsilon", "delta", "max_items",
                                    "with_counts"]),
            (compare.build_parser(), ["epsilon", "delta"] + list(compare.SHARED)
             + ["allow_unproven"])]:
        got = _flags(parser)
        for name in names:
            assert got[name] == declared[name], name
    from beam_dpsu.pipelines import audit as audit_cli
    got = _flags(audit_cli.build_parser())
    assert all(got[n] == declared[n] for n in params.MECHANISM_PARAMS)


def test_messages_name_declared_parameters_as_flags():
    assert params.as_flags("max_items_per_user must be an integer >= 1, got 0") == \
        "--max-items-per-user must be an integer >= 1, got 0"
    assert params.as_flags("k_bar must be >= k=5, got 3") == "--k-bar must be >= k=5, got 3"
    assert params.as_flags("epsilon must be > 0") == "--epsilon must be > 0"
    assert params.as_flags("with_counts (Algorithm 1) needs max_items_per_user (Δ)") == \
        "--with-counts (Algorithm 1) needs --max-items-per-user (Δ)"
    assert params.as_flags("the delta is too small") == "the delta is too small"


def _flag_takers():
    from beam_dpsu.dp.mechanisms.peeling import DiscoverPeelTopK
    from beam_dpsu.transforms.peeling import DiscoverThenPeelTransform
    from beam_dpsu.transforms.select import SelectPartitions
    from beam_dpsu.transforms.textio import ReadUserItems
    from beam_dpsu.transforms.topk import TopK
    wg = make_mechanism("weighted-gaussian", epsilon=1.0, delta=1e-5)
    return {
        "with_counts": lambda v: TopKMechanism(3, 1.0, 1e-5, max_items=3, with_counts=v),
        "SelectPartitions per_user": lambda v: SelectPartitions(wg, per_user=v),
        "TopK per_user": lambda v: TopK(TopKMechanism(3, 1.0, 1e-5), per_user=v),
        "DiscoverThenPeel per_user": lambda v: DiscoverThenPeelTransform(
            DiscoverPeelTopK(3, 1.0, 1e-5), per_user=v),
        "keep_order": lambda v: ReadUserItems("in.tsv", keep_order=v),
        "with_malformed": lambda v: ReadUserItems("in.tsv", with_malformed=v),
        "split_files": lambda v: ReadUserItems("in.tsv", split_files=v),
        "seeded": lambda v: RunKey(b"k" * 32, seeded=v),
    }


@pytest.mark.parametrize("name", sorted(_flag_takers()))
def test_flags_are_true_or_false(name):
    # A string such as "no" would read as True: refused where the object is built.
    build = _flag_takers()[name]
    for bad in ("no", "False", 0, 1, None):
        with pytest.raises(ValueError, match="True or False"):
            build(bad)
    build(False)
    build(True)


def test_a_top_k_purpose_is_a_non_empty_string():
    from beam_dpsu.transforms.topk import TopK
    for bad in (5, "", None):
        with pytest.raises(ValueError, match="purpose"):
            TopK(TopKMechanism(3, 1.0, 1e-5), purpose=bad)
