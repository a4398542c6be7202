"""python -m rljax.generate: greedy output equals the rollout sampler's, generate -> eval end to end, bad input."""

import itertools
import json
import pathlib

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flax import nnx

from rljax import config as config_lib
from rljax import eval as eval_cli
from rljax import generate as generate_cli
from rljax.evaluation import cli
from rljax.evaluation import config as eval_config
from rljax.evaluation import generation
from rljax.models import from_pretrained, load_tokenizer, save_pretrained
from rljax.rollout import RolloutSampler, SamplingParams, factory, make_engine
from rljax.training.checkpointing import Checkpointer
from tests import processes
from tests.rl import tiny_run

ROOT = pathlib.Path(__file__).resolve().parents[2]
GENERATE_CONFIG = f"--config={ROOT / 'configs' / 'generate.py'}"
EVAL_CONFIG = f"--config={ROOT / 'configs' / 'eval.py'}"
RESPONSE = 6
QUESTIONS = ["What is 2 + 3?", "Name a colour.", "Count from one to five, please, slowly and clearly.", "Hi", "7 * 6?"]


def noisy_model_dir(path):
  """tiny_run's 2-layer width-64 Llama (SmolLM2's tokenizer) with N(0, 0.3^2) added to every weight.

  The plain initialisation answers every prompt with the same token; the
  noise makes greedy responses depend on the prompt.
  """
  return with_noise(tiny_run.tiny_model_dir(path))


def with_noise(model_dir):
  """The model directory's weights with N(0, 0.3^2) added to each, saved in place."""
  model = from_pretrained(model_dir)
  graphdef, params = nnx.split(model, nnx.Param)
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(3), len(leaves))
  noisy = [x + 0.3 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
  save_pretrained(nnx.merge(graphdef, jax.tree.unflatten(tree, noisy)), model_dir, tokenizer=load_tokenizer(model_dir))
  return model_dir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  root = tmp_path_factory.mktemp("generate")
  model_dir = noisy_model_dir(root / "model")
  rows = [{"data_source": "rljax/arithmetic", "prompt": [{"role": "user", "content": q}], "ability": "math",
           "reward_model": {"style": "rule", "ground_truth": str(i)}, "extra_info": {"index": i}}
          for i, q in enumerate(QUESTIONS)]
  prompts = str(root / "prompts.parquet")
  pq.write_table(pa.Table.from_pylist(rows), prompts)
  return {"root": root, "model": model_dir, "prompts": prompts}


def generate_args(tiny, out, *extra):
  return [GENERATE_CONFIG, f"data.path={tiny['prompts']}", f"data.output_path={out}", f"model.path={tiny['model']}",
          "rollout.prompt_length=96", f"rollout.response_length={RESPONSE}", "trainer.n_gpus_per_node=1", *extra]


def resolved(args):
  command = cli.parse(args, "rljax.generate", "")
  return cli.resolve(command, eval_config.validate_generate, eval_config.get_generate_config)


def sampler_greedy(model_dir, params=None):
  """Greedy texts from a RolloutSampler built here: chat template tokenised by the tokenizer, one prefill bucket."""
  model, tokenizer = from_pretrained(model_dir), load_tokenizer(model_dir)
  params = nnx.state(model, nnx.Param) if params is None else params
  prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
             for q in QUESTIONS]
  ids = np.full((len(prompts), 128), tokenizer.pad_token_id, np.int32)
  mask = np.zeros_like(ids)
  for i, p in enumerate(prompts):
    ids[i, -len(p):], mask[i, -len(p):] = p, 1
  engine = make_engine(model, max_concurrent_decodes=8, prefill_buckets=(128,), max_decode_length=RESPONSE,
                       sampling_params=SamplingParams(greedy=True), eos_ids=tokenizer.eos_token_ids)
  rollout = RolloutSampler(engine, pad_id=tokenizer.pad_token_id).generate(params, ids, mask, 1, jax.random.key(7))
  return [tokenizer.decode(r[:n].tolist(), skip_special_tokens=True)
          for r, n in zip(rollout.responses, rollout.response_lengths)]


@pytest.fixture(scope="module")
def base_greedy(tiny):
  return sampler_greedy(tiny["model"])


@pytest.mark.slow
def test_greedy_equals_rollout_sampler(tiny, base_greedy):
  out = tiny["root"] / "greedy.parquet"
  args = generate_args(tiny, out, "rollout.do_sample=false", "data.n_samples=1", "data.batch_size=2")
  assert generate_cli.main(args) == 0
  table = pq.read_table(out)
  expected = base_greedy
  assert table.column("responses").to_pylist() == [[text] for text in expected]
  assert len(set(expected)) > 1 and all(expected)
  assert table.drop_columns(["responses"]).equals(pq.read_table(tiny["prompts"]))


@pytest.mark.slow
def test_checkpoint_actor_generates(tiny, base_greedy):
  """model.checkpoint: the latest complete step's actor, on the run's model and tokenizer."""
  run_dir = str(tiny["root"] / "run")
  base = from_pretrained(tiny["model"])
  params = nnx.state(base, nnx.Param)
  trained = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(1), x.shape, x.dtype), params)
  run_config = config_lib.get_base_config()
  run_config.actor_rollout_ref.model.path = tiny["model"]
  run_config.trainer.default_local_dir = run_dir
  with Checkpointer.from_config(run_config) as ckpt:
    ckpt.save(1, {"actor": params})
    ckpt.save(2, {"actor": trained})
  out = tiny["root"] / "ckpt.parquet"
  args = generate_args(tiny, out, "rollout.do_sample=false", "data.n_samples=1", f"model.checkpoint={run_dir}",
                       "model.path=does-not-matter")
  assert generate_cli.main(args) == 0
  got = [r[0] for r in pq.read_table(out).column("responses").to_pylist()]
  assert got == sampler_greedy(tiny["model"], trained)
  assert got != base_greedy


def score_by_length(solution_str):
  return (len(solution_str) % 4) / 2


@pytest.mark.slow
def test_generate_then_eval_end_to_end(tiny):
  out = tiny["root"] / "sampled.parquet"
  args = generate_args(tiny, out, "data.n_samples=3", "data.batch_size=2", "rollout.temperature=1.0",
                       "rollout.top_k=-1", "rollout.top_p=1.0", "trainer.n_gpus_per_node=2", "rollout.max_num_seqs=4")
  assert generate_cli.main(args) == 0
  table = pq.read_table(out)
  assert table.schema.field("responses").type == pa.list_(pa.string())
  responses = table.column("responses").to_pylist()
  assert [len(r) for r in responses] == [3] * len(QUESTIONS)
  assert len({text for r in responses for text in r}) > len(QUESTIONS)  # samples differ

  reward = tiny["root"] / "length_reward.py"
  reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "  return (len(solution_str) % 4) / 2\n")
  assert eval_cli.main([EVAL_CONFIG, f"data.path={out}", f"custom_reward_function.path={reward}"]) == 0
  report = json.loads((tiny["root"] / "sampled-eval.json").read_text())
  scores = np.asarray([[score_by_length(t) for t in r] for r in responses])
  np.testing.assert_allclose(report["scores"], scores)
  group = report["data_sources"]["rljax/arithmetic"]
  assert group["mean@3"] == pytest.approx(scores.mean())
  assert group["best@3"] == pytest.approx(scores.max(axis=1).mean())
  for m in (1, 2, 3):
    subsets = [np.mean([any(s >= 1.0 for s in c) for c in itertools.combinations(r, m)]) for r in scores]
    assert group[f"pass@{m}"] == pytest.approx(np.mean(subsets))


@pytest.mark.slow  # a 2-process generation and evaluation (about 40 s)
def test_two_processes_generate_and_evaluate_what_one_does(tiny):
  # each batch's prompts split over the hosts (3 = 2 + 1, then 2 = 1 + 1), sampled, merged and written once
  args = generate_args(tiny, "OUT", "data.n_samples=2", "data.batch_size=3", "rollout.temperature=1.0",
                       "rollout.top_k=-1", "rollout.top_p=1.0")
  one, two = tiny["root"] / "one.parquet", tiny["root"] / "two.parquet"
  assert generate_cli.main([a.replace("OUT", str(one)) for a in args]) == 0
  procs = processes.start(["-m", "rljax.generate", *[a.replace("OUT", str(two)) for a in args]], 2, devices=2)
  logs = processes.finish(procs, timeout=300)
  assert all(p.returncode == 0 for p in procs), "\n".join(logs)
  assert pq.read_table(two).equals(pq.read_table(one))
  assert len({t for r in pq.read_table(one).column("responses").to_pylist() for t in r}) > len(QUESTIONS)
  procs = processes.start(["-m", "rljax.eval", EVAL_CONFIG, f"data.path={two}"], 2, devices=2)
  logs = processes.finish(procs, timeout=300)
  assert all(p.returncode == 0 for p in procs), "\n".join(logs)
  assert eval_cli.main([EVAL_CONFIG, f"data.path={one}"]) == 0
  report = lambda name: json.loads((tiny["root"] / f"{name}-eval.json").read_text())
  assert report("two")["scores"] == report("one")["scores"]
  assert sum("rljax.evaluation: wrote" in log for log in logs) == 1


def test_over_long_prompt_names_the_row(tiny, capsys):
  rows = pq.read_table(tiny["prompts"]).to_pylist()
  rows[3]["prompt"] = [{"role": "user", "content": "word " * 200}]
  path = tiny["root"] / "long.parquet"
  pq.write_table(pa.Table.from_pylist(rows), path)
  args = generate_args(tiny, tiny["root"] / "never.parquet", f"data.path={path}")
  with pytest.raises(ValueError, match=r"long\.parquet row 3: the templated prompt is \d+ tokens, longer than "
                                       r"rollout\.prompt_length=96"):
    generation.run(resolved(args))
  assert generate_cli.main(args) == 1
  assert "row 3" in capsys.readouterr().err
  assert not (tiny["root"] / "never.parquet").exists()


def test_truncation_modes_cut_instead_of_failing():
  ids = list(range(10))
  assert generation.fit_prompt(ids, 4, "left", "f row 0") == [6, 7, 8, 9]
  assert generation.fit_prompt(ids, 4, "right", "f row 0") == [0, 1, 2, 3]
  assert generation.fit_prompt(ids, 4, "middle", "f row 0") == [0, 1, 8, 9]
  assert generation.fit_prompt(ids, 10, "error", "f row 0") == ids
  with pytest.raises(ValueError, match="f row 0"):
    generation.fit_prompt(ids, 9, "error", "f row 0")


def test_a_vision_language_model_generates_from_image_prompts_as_greedy_decoding_does(tiny, tmp_path):
  """verl's multimodal parquet (geometry3k's layout): each prompt's images prepared as the RL data prepares them,
  its <image> placeholders their tokens, its greedy response the model's own greedy decoding from its images."""
  from rljax.data import dataset
  from rljax.data.images import ImageProcessing
  from rljax.models import greedy_generate, vision
  from tests.rl import vl_run
  model_dir = with_noise(vl_run.vl_model_dir(tmp_path / "vl"))  # its greedy responses then differ with the images
  prompts = vl_run.write_geometry3k(tmp_path / "geo.parquet", 4)
  out = tmp_path / "out.parquet"
  generation.run(resolved([GENERATE_CONFIG, f"data.path={prompts}", f"data.output_path={out}",
                           f"model.path={model_dir}", "data.image_patch_size=4", "rollout.prompt_length=96",
                           f"rollout.response_length={RESPONSE}", "rollout.do_sample=false", "data.n_samples=1",
                           "trainer.n_gpus_per_node=1"]))
  got = [r[0] for r in pq.read_table(out).column("responses").to_pylist()]
  model, tokenizer = from_pretrained(model_dir), load_tokenizer(model_dir)
  rows = dataset.RLHFDataset(prompts, tokenizer, {"max_prompt_length": 96, "image_patch_size": 4},
                             processor=ImageProcessing.of_model(model_dir))
  want = []
  for row in rows:
    pixels, grids = row["multi_modal_inputs"]["pixel_values"], row["multi_modal_inputs"]["image_grid_thw"]
    tokens = greedy_generate(model, row["input_ids"][None], row["attention_mask"][None], RESPONSE,
                             eos_ids=tokenizer.eos_token_ids,
                             images=vision.Images(pixels, vision.image_layout(grids, model.cfg.vision)),
                             grid_thw=grids)[0]
    ended = [i for i, t in enumerate(tokens) if t in tokenizer.eos_token_ids]
    want.append(tokenizer.decode(tokens[:ended[0] + 1 if ended else RESPONSE].tolist(), skip_special_tokens=True))
  assert got == want and len(set(want)) > 1
  # a text model given the same rows names the first row with images
  with pytest.raises(ValueError, match=r"geo\.parquet row 0: column 'images' \(data.image_key\) holds images, and "
                                       r"the model has no preprocessor_config.json"):
    generation.run(resolved(generate_args(tiny, out, f"data.path={prompts}")))


def test_bad_columns_and_messages_name_row_and_key(tiny):
  with pytest.raises(KeyError, match=r"'question' \(data\.prompt_key\) not found"):
    generation.run(resolved(generate_args(tiny, tiny["root"] / "never.parquet", "data.prompt_key=question")))
  rows = pq.read_table(tiny["prompts"]).to_pylist()
  rows[2]["prompt"] = [{"role": "user"}]
  path = tiny["root"] / "bad_messages.parquet"
  pq.write_table(pa.Table.from_pylist(rows), path)
  with pytest.raises(ValueError, match=r"bad_messages\.parquet row 2: column 'prompt'"):
    generation.run(resolved(generate_args(tiny, tiny["root"] / "never.parquet", f"data.path={path}")))


@pytest.mark.parametrize("override, needle", [
    ("model.path=/no/such/model", "model.path=/no/such/model: model path '/no/such/model' does not exist"),
    ("model.checkpoint=/no/such/run", "model.checkpoint=/no/such/run: checkpoint directory /no/such/run does not"),
])
def test_missing_model_names_the_key(tiny, capsys, override, needle):
  assert generate_cli.main(generate_args(tiny, tiny["root"] / "never.parquet", override)) == 1
  assert needle in capsys.readouterr().err


@pytest.mark.parametrize("override, needle", [
    ("data.n_sample=2", "data.n_sample: unknown key. Fix: did you mean data.n_samples?"),
    ("rollout.n=4", "rollout.n=4: generation draws data.n_samples"),
    ("rollout.top_p=0", "rollout.top_p=0.0: must be in (0, 1]"),
    ("data.truncation=cut", "data.truncation='cut': is not a truncation mode"),
    ("rollout.temperature=0", "data.n_samples=4: greedy decoding"),
    ("trainer.n_gpus_per_node=64", "trainer.n_gpus_per_node=64: asks for 64 devices"),
    ("rollout.cpu_dot_library=blas", "rollout.cpu_dot_library='blas': must be one of auto, ynnpack, eigen"),
    ("rollout.kv_cache_dtype=int4",
     "rollout.kv_cache_dtype='int4': must be one of auto, int8, fp8, fp8_e4m3, fp8_e5m2"),
    ("rollout.quantization=fp16", "rollout.quantization='fp16': must be null or one of int8, fp8"),
    ("rollout.attention_kernel=flash", "rollout.attention_kernel='flash': must be one of auto, xla, pallas"),
])
def test_bad_keys_are_config_errors(tiny, capsys, override, needle):
  assert generate_cli.main(generate_args(tiny, tiny["root"] / "never.parquet", override)) == 2
  assert needle in capsys.readouterr().err


def test_paths_buckets_and_dry_run(capsys):
  config = eval_config.get_generate_config()
  config_lib.apply_overrides(config, ["data.path=/data/x/test.parquet"])
  assert generation.output_path(config) == "/data/x/test-responses.parquet"
  assert factory.prefill_buckets(96, [32, 64, 128]) == (32, 64, 96)
  assert generation.checkpoint_location("/runs/a/global_step_20/") == ("/runs/a", 20)
  assert generation.checkpoint_location("/runs/a") == ("/runs/a", None)
  assert generate_cli.main([GENERATE_CONFIG, "--dry_run", "data.batch_size=3"]) == 0
  assert "batch_size: 3" in capsys.readouterr().out
