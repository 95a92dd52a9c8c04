"""The run key is never part of what a runner stages (issue: the secret in the job graph).

A runner stages the pipeline proto (``Pipeline.to_runner_api()``): on Dataflow
or Flink anyone who can read the staging bucket, the job graph or the web UI
can read it. These tests check, for every mechanism and top-k, that

* with a fresh key, the launching process never even draws the key bytes
  (they are drawn on a worker), and a serialised pipeline run twice draws
  independent noise, so the proto holds no key;
* with a test seed, neither the key bytes nor any subkey appear anywhere in
  the proto, including inside the pickled (compressed) DoFns;
* a retry reads the same key (the side input is one committed value).
"""
import base64
import bz2
import re
import zlib

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
import pytest

from beam_dpsu.transforms import run_key as keys, runners
from beam_dpsu.transforms.select import SelectPartitions
from beam_dpsu.dp.data.contribution import sampling_keys
from beam_dpsu.dp.randomness.noise import RunKey
from beam_dpsu.dp.mechanisms.policy import GWKT
from beam_dpsu.dp.mechanisms.registry import REGISTRY, make_mechanism
from beam_dpsu.transforms.release import NoisyThreshold
from beam_dpsu.transforms.topk import TopK
from beam_dpsu.dp.mechanisms.topk import TopKMechanism

from test_mechanisms import small_dataset

PUBLIC = {"common": 50, "mid1": 7}
PARAMS = {"epsilon": 1.0, "delta": 1e-5}

# Every purpose the library derives a subkey for (rounds up to 3, top-k's default purpose).
PURPOSES = ([f"sample/{i}" for i in range(3)] + [f"noise/{i}" for i in range(3)]
            + ["order", "item-order", "topk/0/ties", "topk/0/sample", "topk/0/gumbel",
               "topk/0/laplace"])

_B64 = re.compile(rb"[A-Za-z0-9+/]{16,}={0,2}")


def staged_blobs(data: bytes, depth: int = 2):
    """``data`` and every base64 run inside it, decoded and decompressed (bz2, zlib).

    Beam pickles DoFns, CombineFns and Create's values as base64 of compressed
    pickles inside nested protos, so a secret inside a DoFn is not visible in
    the raw bytes; this walks into them (and into pickles inside pickles).
    """
    yield data
    if depth == 0:
        return
    for m in _B64.finditer(data):
        chunk = m.group(0)
        try:
            decoded = base64.b64decode(chunk + b"=" * (-len(chunk) % 4))
        except ValueError:
            continue
        for decompress in (bz2.decompress, zlib.decompress):
            try:
                inner = decompress(decoded)
            except Exception:  # not this compression
                continue
            yield from staged_blobs(inner, depth - 1)


def secrets_of(run_key):
    """The run key and every key derived from it that a worker uses: each purpose's
    subkey, its first 16 bytes (``noise.ItemBits``' SipHash key) and, for the sampling
    purposes, the sampler's two SipHash keys (``contribution.sampling_keys``)."""
    out = [run_key._material()]
    for p in PURPOSES:
        sub = run_key.subkey(p)
        out += [sub, sub[:16]]
        if "sample" in p.split("/"):
            out += list(sampling_keys(sub))
    return out


def leaked(proto, run_key) -> bool:
    needles = secrets_of(run_key)
    return any(n in blob for blob in staged_blobs(proto.SerializeToString()) for n in needles)


def mechanism(name):
    if name == "gw-kt":        # public counts as a mapping: no file needed
        return GWKT(1.0, 1e-5, PUBLIC)
    return make_mechanism(name, **PARAMS)


def build(p, name, run_key):
    occ = small_dataset()
    if name == "top-k":
        return p | beam.Create(occ) | TopK(TopKMechanism(k=3, epsilon=1.0, delta=1e-5), run_key)
    return p | beam.Create(occ) | SelectPartitions(mechanism(name), run_key)


NAMES = sorted(REGISTRY) + ["top-k"]


def test_the_scanner_finds_a_key_hidden_in_a_pickled_dofn():
    # Positive control: a DoFn that captures a subkey is caught, so a pass below means
    # something.
    rk = RunKey.from_test_seed(3)
    sub = rk.subkey("noise/0")
    p = beam.Pipeline()
    _ = p | beam.Create([1]) | beam.Map(lambda x, s=sub: (x, s))
    assert leaked(p.to_runner_api(), rk)


@pytest.mark.parametrize("derived", ["item-bits", "sampling"])
def test_the_scanner_finds_a_derived_key_hidden_in_a_pickled_dofn(derived):
    # The keys actually used (16-byte SipHash keys) are caught too, not only the subkeys.
    rk = RunKey.from_test_seed(3)
    captured = (rk.subkey("noise/0")[:16] if derived == "item-bits"
                else sampling_keys(rk.subkey("sample/0"))[1])
    p = beam.Pipeline()
    _ = p | beam.Create([1]) | beam.Map(lambda x, s=captured: (x, s))
    assert leaked(p.to_runner_api(), rk)


@pytest.mark.parametrize("name", NAMES)
def test_no_key_bytes_in_the_proto_of_a_test_seeded_pipeline(name):
    rk = RunKey.from_test_seed(4242)
    p = beam.Pipeline()
    build(p, name, rk)
    assert not leaked(p.to_runner_api(), rk)


@pytest.mark.parametrize("name", NAMES)
def test_a_fresh_key_is_not_even_drawn_by_the_launching_process(name):
    rk = RunKey.fresh()
    p = beam.Pipeline()
    build(p, name, rk)
    p.to_runner_api()
    assert rk._key is None      # the bytes exist only on the worker that draws them


def _released_lines(path_prefix, tmp_path):
    out = set()
    for f in tmp_path.glob(path_prefix + "*"):
        out |= set(f.read_text().split())
        f.unlink()
    return out


def _run_serialised_twice(tmp_path, run_key):
    """Serialises a pipeline (200 items of weight exactly T = 5, Laplace noise), runs the
    proto twice, and returns the two released sets."""
    hist = [(f"item{i:03d}", 5.0) for i in range(200)]
    p = beam.Pipeline()
    (p | beam.Create(hist) | NoisyThreshold("laplace", 1.0, 5.0, run_key)
     | beam.io.WriteToText(str(tmp_path / "released")))
    proto = p.to_runner_api()
    runs = []
    for _ in range(2):
        options = runners.pipeline_options([])
        again = beam.Pipeline.from_runner_api(
            proto, runner=FnApiRunner(), options=options)
        again.run().wait_until_finish()
        runs.append(_released_lines("released", tmp_path))
    return runs


def test_a_serialised_fresh_key_pipeline_draws_independent_noise_each_run(tmp_path):
    # 200 items, each of weight exactly T: each is released iff its noise is > 0,
    # probability 1/2 independently given the key. If the proto held the key, both
    # runs would release the same set. False failure: the two runs release the same
    # set with probability 2^-200; a run releasing < 40 or > 160 items has
    # probability 2·P(Bin(200, 1/2) < 40) < 1e-17.
    runs = _run_serialised_twice(tmp_path, run_key=None)
    assert all(40 <= len(r) <= 160 for r in runs), [len(r) for r in runs]
    assert runs[0] != runs[1]


def test_a_seeded_serialised_pipeline_replays_the_same_release(tmp_path):
    # The converse: under a test seed (derived on the worker from the staged seed)
    # two runs of the same proto are identical. Deterministic.
    runs = _run_serialised_twice(tmp_path, run_key=RunKey.from_test_seed(9))
    assert runs[0] == runs[1] and 40 <= len(runs[0]) <= 160


def test_transforms_sharing_a_key_object_share_one_drawn_key():
    rk = RunKey.fresh()
    p = beam.Pipeline()
    a = keys.pipeline_key(p, rk)
    b = keys.pipeline_key(p, rk)
    c = keys.pipeline_key(p, RunKey.fresh())
    assert a is b and c is not a


def test_explicit_key_bytes_are_refused_by_transforms():
    with pytest.raises(ValueError, match="job graph"):
        SelectPartitions(make_mechanism("weighted-gaussian", **PARAMS),
                         RunKey(b"0123456789abcdef0123456789abcdef"))
