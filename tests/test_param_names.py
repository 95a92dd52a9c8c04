"""One parameter, accepted under each of its names: Δ0 as ``max_items`` (Python),
``max_items_per_user`` (the JSON key and the flag ``--max-items-per-user``) and
PipelineDP's ``max_partitions_contributed``, on every surface a user types it."""
import pytest

from beam_dpsu.pipelines import audit as audit_cli
from beam_dpsu.pipelines.console import UsageError
from beam_dpsu.dp.privacy import params
from beam_dpsu.dp.mechanisms.registry import make_mechanism
from beam_dpsu.pipelines import arguments, compare

IO = ["--input", __file__, "--output", "/tmp/beam-dpsu-never-written"]
SPELLINGS = ["--max-items-per-user", "--max-partitions-contributed", "--max-items"]


@pytest.mark.parametrize("flag", SPELLINGS)
def test_select_accepts_every_flag_spelling(flag):
    _, plan, _ = arguments.parse_select(
        IO + ["--mechanism", "weighted-gaussian", "--epsilon", "1", "--delta", "1e-6", flag, "7"])
    mechanism = plan.mechanism
    assert mechanism.max_items == 7 and mechanism.describe()["max_items_per_user"] == 7


@pytest.mark.parametrize("flag", SPELLINGS)
def test_top_k_and_audit_accept_every_flag_spelling(flag):
    _, mechanism, _ = arguments.parse_top_k(IO + ["--k", "3", "--epsilon", "1", "--delta",
                                                  "1e-6", flag, "4"])
    assert mechanism.max_items == 4
    _, audited = audit_cli.parse_args(["--mechanism", "weighted-laplace", "--epsilon", "1",
                                   "--delta", "1e-6", flag, "5"])
    assert audited.max_items == 5


def test_help_names_the_aliases(capsys):
    with pytest.raises(SystemExit):
        arguments.select_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--max-items-per-user" in out and "--max-partitions-contributed" in out


@pytest.mark.parametrize("key", ["max_items", "max_items_per_user", "max_partitions_contributed",
                                 "max-partitions-contributed"])
def test_compare_specs_accept_every_spelling(key):
    assert compare.parse_mechanisms(f"weighted-gaussian:{key}=9,gw") == [
        ("weighted-gaussian", {"max_items": 9}), ("gw", {})]


def test_compare_shared_flag_alias(tmp_path):
    args, *_ = compare.parse_args(["--input", __file__, "--output", str(tmp_path),
                                   "--epsilon", "1", "--delta", "1e-6", "--mechanisms", "gw",
                                   "--max-partitions-contributed", "6"])
    assert args.max_items == 6


@pytest.mark.parametrize("key", ["max_items", "max_items_per_user", "max_partitions_contributed"])
def test_make_mechanism_accepts_every_keyword(key):
    m = make_mechanism("weighted-gaussian", epsilon=1, delta=1e-6, **{key: 11})
    assert m.max_items == 11


def test_two_spellings_of_one_parameter_are_refused():
    with pytest.raises(ValueError, match="given twice"):
        make_mechanism("weighted-gaussian", epsilon=1, delta=1e-6, max_items=3,
                       max_partitions_contributed=4)


def test_messages_name_the_flag_whatever_the_spelling():
    assert params.as_flags("max_partitions_contributed must be an integer >= 1") == \
        "--max-items-per-user must be an integer >= 1"
    with pytest.raises(UsageError, match="--max-items-per-user"):
        arguments.parse_select(IO + ["--mechanism", "weighted-gaussian", "--epsilon", "1",
                                     "--delta", "1e-6", "--max-partitions-contributed", "0"])


def test_public_name_is_the_json_key():
    assert params.MECHANISM_PARAMS["max_items"].public_name == "max_items_per_user"
    assert params.canonical("max_partitions_contributed") == "max_items"


def test_gw_default_max_items_is_one_plus_five_epsilon_rounded():
    from fractions import Fraction

    from beam_dpsu.dp.privacy.params import MAX_MAX_ITEMS, gw_default_max_items

    # Independent computation: exact rational arithmetic, round half up.
    def expected(eps):
        x = 1 + 5 * Fraction(eps)
        n = int(x + Fraction(1, 2))
        return min(MAX_MAX_ITEMS, max(1, n))

    # (ε away from the half-way points 0.1 + 0.2k, where float rounding may decide)
    for eps in (1e-9, 0.05, 0.2, 0.33, 0.77, 1, 1.17, 2, 2.95, 3, 3.14, 5, 10, 1e5, 1e300):
        assert gw_default_max_items(eps) == expected(eps), eps
    assert [gw_default_max_items(e) for e in (1, 3, 5)] == [6, 16, 26]
    for bad in (0, -1, float("inf"), float("nan"), True, "3", None):
        with pytest.raises(ValueError, match="epsilon"):
            gw_default_max_items(bad)


def test_gwkt_default_max_items_is_gw_rule_plus_four_or_the_prefix_constant():
    from beam_dpsu.dp.privacy.params import MAX_MAX_ITEMS, gw_default_max_items, gwkt_default_max_items

    # Independent computation: round(1 + 5ε) half up, + 4 (front); 100 (prefix).
    assert [gwkt_default_max_items(e) for e in (1, 3, 5)] == [10, 20, 30]
    assert gwkt_default_max_items(0.01) == 1 + 4
    assert gwkt_default_max_items(2.95) == 16 + 4 == gw_default_max_items(2.95) + 4
    assert gwkt_default_max_items(1e300) == MAX_MAX_ITEMS
    assert gwkt_default_max_items(3, "prefix") == gwkt_default_max_items(0.5, "prefix") == 100
    with pytest.raises(ValueError, match="kt_selection"):
        gwkt_default_max_items(3, "window")
    with pytest.raises(ValueError, match="epsilon"):
        gwkt_default_max_items(0, "prefix")
