"""Task evaluation: TaskDataModule through CausalLMModule's test step (cli.py test), and the lm-eval adapter, both
held to lm-eval-harness's definitions on tiny random-weight nets."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
import torch
from conftest import CONFIGS, fit_in_folder, terminal

from datamodules.tasks import TaskDataModule
from zoo.errors import InputError
from zoo.gpt import GPT, CausalLMModule
from zoo.gpt import tasks as T
from zoo.io.tokenizers import ByteTokenizer

CHOICES = ["mat", "dog", "éé", "a longer choice", "zèbre", "x", "ünïcödé", "the end"]


def tiny_module(block_size: int = 32) -> CausalLMModule:
    torch.manual_seed(0)
    module = CausalLMModule(GPT(vocab_size=257, block_size=block_size, n_layer=1, n_embd=16, n_head=2)).eval()
    module.tokenizer = ByteTokenizer()
    return module


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def mc_records(n: int = 16) -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {"query": f"Record {k}: the cat sat on", "choices": list(rng.choice(CHOICES, 4, replace=False)), "label": k % 4}
        for k in range(n)
    ]


def direct_loglikelihood(net, ctx: list[int], cont: list[int]) -> float:
    """log p(cont | ctx) from one unpadded forward of ctx + cont."""
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = net(ids[:, :-1]).float().log_softmax(-1)[0]
    return sum(logp[len(ctx) - 1 + i, tok].item() for i, tok in enumerate(cont))


def test_rolling_windows_and_pair_encoding_equal_lm_evals():
    utils = pytest.importorskip("lm_eval.utils")
    ids = list(range(1, 75))
    for width in (8, 32, 100):
        theirs = [utils.make_disjoint_window(w) for w in utils.get_rolling_token_windows(ids, 0, width, 1)]
        assert T.rolling_windows(ids, 0, width) == [tuple(map(list, w)) for w in theirs]
    from zoo.gpt.lm_eval import ZooLM

    lm, tok = ZooLM(tiny_module()), ByteTokenizer()
    for ctx, cont in [("Question: 1 + 1 = ", "2"), ("The cat", " sat"), ("", "alone")]:
        assert T.encode_pair(tok, ctx, cont) == (
            lm._encode_pair(ctx, cont) if ctx else ([tok.eos_id], tok.encode(cont))
        )


def test_scores_equal_a_direct_sum_row_by_row_and_greedy_is_every_argmax():
    net = tiny_module(block_size=16).net
    pairs = [([5, 6, 7], [8, 9]), ([1], [2, 3, 4, 5]), (list(range(10, 30)), [40, 41])]  # the last one cut to 17
    lls, greedy = T.score_continuations(net, pairs)
    for (ctx, cont), ll in zip(pairs, lls.tolist(), strict=True):
        keep = (ctx + cont)[-17:]
        assert ll == pytest.approx(direct_loglikelihood(net, keep[: len(keep) - len(cont)], cont), abs=1e-4)
    with torch.no_grad():
        best = net(torch.tensor([[5, 6, 7]])).argmax(-1)[0, -1].item()
    assert T.score_continuations(net, [([5, 6, 7], [best])])[1].item() and not greedy[1:].all()


def test_multiple_choice_predictions_follow_lm_evals_acc_and_acc_norm(tmp_path, one_thread):
    module = tiny_module(block_size=64)
    dm = TaskDataModule(write_jsonl(tmp_path / "mc.jsonl", mc_records()), kind="multiple_choice", batch_size=16)
    dm.tokenizer = module.tokenizer
    batch = next(iter(dm.test_dataloader()))
    with torch.no_grad():
        ours = T.multiple_choice(module.net, batch)
    acc, acc_norm, acc_bytes = [], [], []
    for r in mc_records():  # lm_eval/api/task.py's process_results, with the lls from an unpadded forward each
        lls = np.array(
            [direct_loglikelihood(module.net, *T.encode_pair(dm.tokenizer, r["query"], " " + c)) for c in r["choices"]]
        )
        acc.append(np.argmax(lls) == r["label"])
        acc_norm.append(np.argmax(lls / np.array([len(c) for c in r["choices"]])) == r["label"])
        acc_bytes.append(np.argmax(lls / np.array([len(c.encode()) for c in r["choices"]])) == r["label"])
    assert ours["acc"].tolist() == acc and ours["acc_norm"].tolist() == acc_norm
    assert ours["acc_bytes"].tolist() == acc_bytes and acc_norm != acc_bytes  # the data tells them apart


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
def test_multiple_choice_with_a_bos_adding_tokenizer_has_one_bos_before_the_context(tmp_path, chat):
    from test_chat import LLAMA3, _with_template, write_tokenizer

    (tmp_path / "tok").mkdir()
    tok, _ = _with_template(write_tokenizer(tmp_path / "tok"), LLAMA3)
    assert tok.encode("x")[0] == tok.bos_id  # its post-processor adds a BOS
    record = {"query": "The quick brown fox", "choices": ["jumps", "the lazy dog"], "label": 0}
    dm = TaskDataModule(write_jsonl(tmp_path / "mc.jsonl", [record]), kind="multiple_choice", chat=chat)
    dm.tokenizer = tok
    ((ctx, conts, *_),) = dm.items()
    assert ctx[0] == tok.bos_id and ctx.count(tok.bos_id) == 1
    for choice, cont in zip(record["choices"], conts, strict=True):
        assert tok.bos_id not in cont  # a choice's log-likelihood never scores a BOS
        if chat:  # the reply after the generation prompt, as its own text
            assert cont == tok.hf.encode(choice, add_special_tokens=False).ids
        else:  # lm-eval's split of the whole text
            assert ctx + cont == tok.encode(record["query"] + " " + choice)


def test_bits_per_byte_is_the_files_bits_over_its_bytes_in_windows(tmp_path):
    import lightning as L

    module = tiny_module(block_size=16)
    texts = ["héllo wörld, " * 5, "short"]  # the first past block_size: several windows
    dm = TaskDataModule(write_jsonl(tmp_path / "t.jsonl", [{"text": t} for t in texts]), kind="bits_per_byte")
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    got = trainer.test(module, datamodule=dm, verbose=False)[0]["test/bits_per_byte"]
    nats = sum(direct_loglikelihood(module.net, [256], list(t.encode())) for t in texts if len(t.encode()) < 16)
    nats += sum(
        direct_loglikelihood(module.net, ctx, cont) for ctx, cont in T.rolling_windows(list(texts[0].encode()), 256, 16)
    )
    assert got == pytest.approx(-nats / math.log(2) / sum(len(t.encode()) for t in texts), rel=1e-4)


def test_answers_are_extracted_by_the_stated_rule():
    assert T.extract_answer("so 3 + 4 = 7.\n#### 1,234") == "1234"
    assert T.extract_answer("First 12 apples, then 15 pears, $1,500 total.") == "1500"
    assert T.extract_answer("no number here ") == "no number here"
    assert T.extract_answer("Answer: (B) not A", r"\(([A-D])\)") == "B"
    assert T.reference("She pays 2 * 3 = 6.\n#### 6") == "6" and T.reference(" 1,000 ") == "1000"
    # the first match, in a completion and a reference alike (lm-eval's strict-match, group_select 0)
    number = r"Answer: (\d+)"
    assert T.extract_answer("Answer: 0123 then 4567", number) == "0123"
    assert T.reference("Answer: 0123, Answer: 9", number) == "0123"
    assert T.extract_answer("#### 3\n#### 5") == "3"
    # a given rule that reads nothing is no answer, never the text compared whole; a bare reference is itself
    assert T.extract_answer("42", number) is None and not T.correct("42", "42", number)
    assert T.correct("Answer: Paris.", "Paris", "Answer: (.+)") and T.reference(" $ ") is None
    with pytest.raises(InputError, match="not a regular expression"):
        TaskDataModule(__file__, kind="exact_match", answer_pattern="Answer: (")


def test_an_answer_rule_that_backtracks_without_end_is_stopped_at_its_deadline(monkeypatch):
    from zoo.gpt.tune.rewards import ExactMatch, score

    monkeypatch.setattr(T, "RULE_SECONDS", 0.05)
    slow = "a" * 22 + "b"  # (a+)+$ backtracks 2^22 times on it: ~1.5 s unbounded, a regex is code with a deadline
    with pytest.raises(InputError, match=r"ran past 0\.05 s on a text of 23 characters"):
        T.correct(slow, "1", r"(a+)+$")
    assert T.correct("Answer: 7", "7", r"Answer: (\d+)")  # the timer is off again
    with pytest.raises(InputError, match="reward ExactMatch ran past reward_timeout=0.05 s"):  # a reward's deadline
        score([ExactMatch()], [slow], ["1"], timeout=0.05, pattern=r"(a+)+$")
    with pytest.raises(InputError, match="more than 1000"):
        T.check_pattern("(a)" + "b" * 1000)


def test_an_answer_rule_keeps_its_deadline_under_a_later_outer_timer_and_puts_that_timer_back(monkeypatch):
    import signal

    monkeypatch.setattr(T, "RULE_SECONDS", 0.05)
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    signal.setitimer(signal.ITIMER_REAL, 60.0)  # a test runner's or a caller's, far later than the rule's
    try:
        with pytest.raises(InputError, match=r"ran past 0\.05 s"):
            T.correct("a" * 22 + "b", "1", r"(a+)+$")
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 55.0 < left <= 60.0 and not fired  # the outer timer runs on, less the time the rule took
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_trailing_full_stop_is_stripped_from_answers():
    assert T.normalise(" 42. ") == "42" and T.normalise("3.5") == "3.5"  # a final "." goes, a decimal point stays
    assert T.extract_answer("The answer: 1,000.", r"answer: (.*)") == "1000"
    assert T.reference("She has 7.\n#### 7.") == "7" and T.extract_answer("She has 7.") == "7"


def test_lm_eval_generates_greedily_unless_a_task_sets_do_sample():
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from zoo.gpt.lm_eval import ZooLM

    lm = ZooLM(tiny_module())

    def reply(seed: int, **kwargs) -> str:
        torch.manual_seed(seed)
        request = Instance("generate_until", {}, ("The cat", {"until": ["\n\n\n"], "max_gen_toks": 12, **kwargs}), 0)
        return lm.generate_until([request])[0]

    greedy = reply(0)
    assert reply(1, do_sample=False, temperature=1.0) == greedy == reply(2, do_sample=False, temperature=1.0)
    assert reply(1, do_sample=True, temperature=1.0) != reply(2, do_sample=True, temperature=1.0)


def test_exact_match_compares_the_greedy_answer(tmp_path):
    import lightning as L

    module = tiny_module()
    questions = ["What is 2 + 2?", "Name a colour."]
    with torch.no_grad():
        said = module.generate(questions, max_new_tokens=6, temperature=0)
    records = [{"question": questions[0], "answer": T.normalise(said[0])}, {"question": questions[1], "answer": "nope"}]
    dm = TaskDataModule(
        write_jsonl(tmp_path / "em.jsonl", records), kind="exact_match", max_new_tokens=6, answer_pattern="(?s)(.*)"
    )
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    assert trainer.test(module, datamodule=dm, verbose=False)[0]["test/exact_match"] == 0.5


def test_chat_prompts_are_the_templates_generation_prompt(tmp_path):
    from zoo.io.chat_template import chat_renderer

    tok = ByteTokenizer()
    render = chat_renderer(tok)
    user = [{"role": "user", "content": "The cat sat on"}]
    dm = TaskDataModule(write_jsonl(tmp_path / "c.jsonl", [mc_records(1)[0]]), kind="multiple_choice", chat=True)
    dm.tokenizer = tok
    ((ctx, conts, *_),) = dm.items()
    assert ctx == render([{"role": "user", "content": mc_records(1)[0]["query"]}], True).ids
    assert conts == [tok.encode(c) for c in mc_records(1)[0]["choices"]]  # the reply: no target_delimiter
    messages = [{"role": "system", "content": "Be brief."}, *user]
    dm = TaskDataModule(
        write_jsonl(tmp_path / "e.jsonl", [{"messages": messages, "answer": "mat"}]), kind="exact_match", chat=True
    )
    dm.tokenizer = tok
    assert dm.items() == [(render(messages, True).ids, "mat")]


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What sat on the mat?"},
    {"role": "assistant", "content": "The cat."},
    {"role": "user", "content": "And on the log?"},
]


def test_lm_evals_chat_prompts_are_the_zoos_rendering(monkeypatch):
    """lm-eval hands a chat prompt back as text: its ids are the zoo's rendering, the generation prompt kept whole and
    the reply scored after it (as TaskDataModule's chat: true), a gen_prefix continued as the final message."""
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from zoo.gpt import lm_eval as adapter
    from zoo.io.chat_template import chat_renderer

    lm, tok = adapter.ZooLM(tiny_module(block_size=256)), ByteTokenizer()  # room for the whole prompt
    rendered = chat_renderer(tok)(CONVERSATION, True)
    text = lm.apply_chat_template(CONVERSATION)
    assert lm.tok_encode(text) == rendered.ids and text.endswith("<|assistant|>\n") and "<|endoftext|>" in text
    assert lm._encode_pair(text, "The dog.") == (rendered.ids, tok.encode("The dog."))
    continued = lm.apply_chat_template([*CONVERSATION, {"role": "assistant", "content": "Answer:"}], False)
    assert lm._encode_pair(continued, " dog") == (rendered.ids + tok.encode("Answer:"), tok.encode(" dog"))
    seen = []
    monkeypatch.setattr(adapter, "generate", lambda net, prompts, *a, **k: seen.extend(prompts) or prompts)
    lm.generate_until([Instance("generate_until", {}, (text, {"until": ["\n"], "max_gen_toks": 2}), 0)])
    assert seen[0].tolist() == rendered.ids
    assert lm.chat_template(True).startswith("zoo default chat format") and lm.tokenizer_name.startswith("zoo-bytes")
    with pytest.raises(InputError, match="has one"):
        lm.chat_template("tool_use")


def test_an_imported_templates_prompt_is_the_text_lm_evals_hf_model_renders(tmp_path):
    """lm-eval's HF model renders with transformers' apply_chat_template (continue_final_message for a gen_prefix):
    the zoo's text is the same, and its ids are transformers' tokens of it."""
    pytest.importorskip("lm_eval")
    from test_chat import LLAMA3, _with_template, write_tokenizer

    from zoo.gpt.lm_eval import ZooLM

    ours, theirs = _with_template(write_tokenizer(tmp_path), LLAMA3)
    module = tiny_module()
    module.tokenizer = ours
    lm = ZooLM(module)
    text = lm.apply_chat_template(CONVERSATION)
    assert text == theirs.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert lm.tok_encode(text) == theirs(text, add_special_tokens=False)["input_ids"]
    prefixed = [*CONVERSATION, {"role": "assistant", "content": "Answer:"}]
    assert lm.apply_chat_template(prefixed, False) == theirs.apply_chat_template(
        prefixed, tokenize=False, continue_final_message=True
    )


@pytest.mark.parametrize(
    ("kind", "record", "why"),
    [
        ("multiple_choice", {"query": "q", "choices": ["a", "b"], "label": 2}, "label"),
        ("multiple_choice", {"choices": ["a"], "label": 0}, "'query' or 'context'"),
        ("exact_match", {"messages": [{"role": "user", "content": "hi"}], "answer": "1"}, "chat: true"),
        ("bits_per_byte", {"text": 3}, "not a string"),
    ],
)
def test_a_malformed_record_is_named_by_line_or_skipped_and_counted(tmp_path, kind, record, why):
    good = {"multiple_choice": mc_records(1)[0], "exact_match": {"question": "q", "answer": "1"}}
    path = write_jsonl(tmp_path / "bad.jsonl", [good.get(kind, {"text": "fine"}), record])
    dm = TaskDataModule(path, kind=kind)
    dm.tokenizer = ByteTokenizer()
    with pytest.raises(InputError, match=rf"bad.jsonl:2 .*{why}.*skip_bad_records"):
        dm.items()
    dm = TaskDataModule(path, kind=kind, skip_bad_records=True)
    dm.tokenizer = ByteTokenizer()
    assert len(dm.items()) == 1 and dm.skipped == 1


# -- through cli.py test and lm-eval, from one checkpoint fitted through cli.py -------------------------------------


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tasks_fit")
    corpus = folder / "corpus.txt"
    corpus.write_text("The cat sat on the mat. The dog sat on the log. " * 40)
    fitted = fit_in_folder(
        folder,
        "--config",
        str(CONFIGS / "gpt" / "gpt_tiny.yaml"),
        f"--data.init_args.path={corpus}",
        f"--data.init_args.root={folder / 'data'}",
        "--trainer.max_steps=1",
        "--trainer.limit_val_batches=0",
        "--trainer.logger=false",
    )
    return str(fitted.last)


@pytest.mark.slow  # cli.py's imports and a one-step fit for its checkpoint: ~11 s on a loaded 2-core machine
def test_cli_test_scores_a_task_file_from_the_checkpoint_alone(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    path = write_jsonl(tmp_path / "mc.jsonl", mc_records(8))
    status, out, err = terminal(
        monkeypatch,
        capsys,
        "test",
        "--ckpt_path",
        tiny_checkpoint,
        "--data",
        "datamodules.TaskDataModule",
        f"--data.init_args.path={path}",
        "--data.init_args.kind=multiple_choice",
        "--trainer.logger=false",
    )
    assert status == 0, err[-3000:]
    assert "test/acc_norm" in out and "test/acc" in out, out[-2000:]


def local_task(tmp_path, monkeypatch) -> tuple[str, object]:
    """mc_records() as the local lm-eval task ``zoo_mc`` (its few shots from the same file): the data and the
    task folder; nothing fetched."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    data = write_jsonl(tmp_path / "mc.jsonl", mc_records())
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "zoo_mc.yaml").write_text(
        "task: zoo_mc\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\nfewshot_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{query}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\n'
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    return data, tasks


def test_an_unknown_lm_eval_task_is_one_line_naming_the_closest_before_any_task_loads(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    import lm_eval

    from zoo.gpt import __main__ as gpt_main
    from zoo.gpt import lm_eval as adapter

    _, tasks = local_task(tmp_path, monkeypatch)
    monkeypatch.setattr(adapter, "ZooLM", lambda *args, **kwargs: object())  # the model is not what is tested
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda **kw: pytest.fail(f"evaluated {kw['tasks']}"))
    argv = ["lm-eval", "x.ckpt", "--include-path", str(tasks), "--no-builtin-tasks", "--tasks"]
    for names, said in [("zoo_mc,zoo_mcq", "'zoo_mcq' is not a task"), (" , ", "names no task")]:
        with pytest.raises(SystemExit) as exit_info:
            gpt_main.main([*argv, names])
        message = str(exit_info.value.code)
        assert message.startswith("error: --tasks") and "\n" not in message and said in message, message
    with pytest.raises(SystemExit) as exit_info:
        gpt_main.main([*argv, "zoo_mcq"])
    assert "did you mean 'zoo_mc'?" in str(exit_info.value.code)
    assert gpt_main.known_tasks(f"zoo_mc,{tasks / 'zoo_mc.yaml'}", ["zoo_mc"]) == ["zoo_mc", str(tasks / "zoo_mc.yaml")]


@pytest.mark.slow  # lm-eval's and datasets' imports, a datasets cache: ~8 s
def test_lm_eval_local_task_agrees_with_task_datamodule(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    pytest.importorskip("lm_eval")
    import lightning as L
    from lm_eval.api.instance import Instance

    from zoo.gpt import __main__ as gpt_main
    from zoo.gpt.lm_eval import ZooLM

    data, tasks = local_task(tmp_path, monkeypatch)
    out = tmp_path / "results.json"
    argv = ["zoo.gpt", "lm-eval", tiny_checkpoint, "--tasks", "zoo_mc", "--include-path", str(tasks)]
    monkeypatch.setattr(sys, "argv", [*argv, "--no-builtin-tasks", "--batch-size", "7", "--output", str(out)])
    gpt_main.main()
    assert "zoo_mc" in capsys.readouterr().out
    theirs = json.loads(out.read_text())["zoo_mc"]

    module = CausalLMModule.load_from_checkpoint(tiny_checkpoint, map_location="cpu").eval()
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    ours = trainer.test(module, datamodule=TaskDataModule(data, kind="multiple_choice", batch_size=5), verbose=False)
    assert theirs["acc,none"] == pytest.approx(ours[0]["test/acc"])
    assert theirs["acc_norm,none"] == pytest.approx(ours[0]["test/acc_norm"])

    lm = ZooLM(module, batch_size=2)
    pairs = [("The cat sat on", " the mat"), ("Once", " upon a time"), ("", "Hello")]
    requests = [Instance("loglikelihood", {}, pair, k) for k, pair in enumerate(pairs)]
    for (ctx, cont), (ll, _) in zip(pairs, lm.loglikelihood(requests), strict=True):
        direct = direct_loglikelihood(module.net, *T.encode_pair(module.tokenizer, ctx, cont))
        assert ll == pytest.approx(direct, abs=1e-4)


# -- each record once across ranks ------------------------------------------------------------------------------


def test_a_record_repeated_to_even_out_ranks_counts_once():
    index = torch.tensor([3, 0, 1, 3, 2, 0])  # two ranks' shares of 4 records and a sampler's repeats
    assert T.first_of_each(index).tolist() == [0, 1, 2, 4]
    mean = T.RecordMean()
    mean.update(index[:3], torch.tensor([1.0, 0.0, 0.0]), weight=torch.tensor([2.0, 1.0, 1.0]))
    mean.update(index[3:], torch.tensor([1.0, 1.0, 0.0]), weight=torch.tensor([2.0, 1.0, 1.0]))
    assert mean.compute().item() == pytest.approx((2 + 1) / 5)  # records 3 (weight 2) and 2 hit; 0 and 1 missed


def _bits_on_ranks(path: str, devices: int) -> float:
    import lightning as L

    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp_spawn" if devices > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    dm = TaskDataModule(path, kind="bits_per_byte", batch_size=2)
    return trainer.test(tiny_module(block_size=16), datamodule=dm, verbose=False)[0]["test/bits_per_byte"]


@pytest.mark.slow  # two spawned gloo processes: ~15 s
def test_two_ranks_score_a_file_as_one_process_does(tmp_path):
    """5 texts on 2 ranks: Lightning's DistributedSampler gives each rank 3, the first text twice; it counts once."""
    texts = ["a much longer first text, " * 3, "b", "cc dd", "éé", "the last one"]
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": t} for t in texts])
    assert _bits_on_ranks(path, 2) == pytest.approx(_bits_on_ranks(path, 1), rel=1e-5)


@pytest.mark.slow  # lm-eval's and datasets' imports, two evaluations: ~10 s
def test_lm_eval_chat_agrees_with_task_datamodules_chat(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    """--apply-chat-template: acc and acc_norm equal TaskDataModule's with chat: true; with few shots as turns,
    every context lm-eval scores is the zoo's rendering of the conversation lm-eval built."""
    pytest.importorskip("lm_eval")
    import lightning as L
    import lm_eval
    from lm_eval.tasks import TaskManager

    from zoo.gpt import __main__ as gpt_main
    from zoo.gpt.lm_eval import ZooLM
    from zoo.io.chat_template import chat_renderer

    data, tasks = local_task(tmp_path, monkeypatch)
    out = tmp_path / "results.json"
    argv = ["zoo.gpt", "lm-eval", tiny_checkpoint, "--tasks", "zoo_mc", "--include-path", str(tasks)]
    monkeypatch.setattr(sys, "argv", [*argv, "--no-builtin-tasks", "--apply-chat-template", "--output", str(out)])
    rendered, apply = [], ZooLM.apply_chat_template
    monkeypatch.setattr(ZooLM, "apply_chat_template", lambda lm, h, **k: rendered.append(h) or apply(lm, h, **k))
    gpt_main.main()
    assert len(rendered) == len(mc_records())  # the flag reaches lm-eval: every prompt rendered by the zoo
    monkeypatch.setattr(ZooLM, "apply_chat_template", apply)
    theirs = json.loads(out.read_text())["zoo_mc"]
    module = CausalLMModule.load_from_checkpoint(tiny_checkpoint, map_location="cpu").eval()
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    dm = TaskDataModule(data, kind="multiple_choice", chat=True, batch_size=5)
    ours = trainer.test(module, datamodule=dm, verbose=False)[0]
    assert theirs["acc,none"] == pytest.approx(ours["test/acc"])
    assert theirs["acc_norm,none"] == pytest.approx(ours["test/acc_norm"])

    class Spy(ZooLM):
        histories, scored = {}, []

        def apply_chat_template(self, chat_history, add_generation_prompt=True):
            text = super().apply_chat_template(chat_history, add_generation_prompt)
            self.histories[text] = [dict(m) for m in chat_history]
            return text

        def _loglikelihood_tokens(self, requests, **kwargs):
            self.scored += requests
            return super()._loglikelihood_tokens(requests, **kwargs)

    lm, render = Spy(module, batch_size=8), chat_renderer(module.tokenizer)
    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    lm_eval.simple_evaluate(
        model=lm, tasks=["zoo_mc"], task_manager=manager, num_fewshot=2, limit=3, apply_chat_template=True
    )
    assert len(lm.scored) == 3 * 4
    for (context, continuation), ctx, cont in lm.scored:
        history = lm.histories[context]
        assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant", "user"]
        assert ctx == render(history, True).ids and cont == module.tokenizer.encode(continuation)


def test_the_gpt_family_leaves_a_registered_model_to_zoo_tracking():
    pytest.importorskip("lm_eval")
    from zoo.gpt.lm_eval import ZooLM

    with pytest.raises(InputError, match=r"MLflow URI.*python -m zoo\.tracking lm-eval models:/tiny-lm/1"):
        ZooLM("models:/tiny-lm/1")


@pytest.mark.slow  # mlflow's, lm-eval's and datasets' imports, a registration: ~15 s
def test_lm_eval_on_a_registered_model_equals_its_checkpoint(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    """``python -m zoo.tracking lm-eval models:/<name>/<version>``: the model lm-eval runs is the checkpoint's
    (weights exactly, and its tokenizer), read weights-only, and its results are the checkpoint's."""
    pytest.importorskip("lm_eval")
    from mlflow.tracking import MlflowClient

    from zoo.gpt import __main__ as gpt_main
    from zoo.tracking import log_checkpoint_model
    from zoo.tracking.__main__ import main as tracking

    _, tasks = local_task(tmp_path, monkeypatch)
    store = f"sqlite:///{tmp_path / 'reg.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    client = MlflowClient(store)
    run_id = client.create_run(client.create_experiment("lm-eval")).info.run_id
    assert log_checkpoint_model(tiny_checkpoint, client, run_id, "tiny-lm").endswith("models:/tiny-lm/1")
    common = ["--tasks", "zoo_mc", "--include-path", str(tasks), "--no-builtin-tasks", "--output"]
    ran, run = [], gpt_main.lm_eval_main
    monkeypatch.setattr(gpt_main, "lm_eval_main", lambda args, module=None: ran.append(module) or run(args, module))
    tracking(["lm-eval", "models:/tiny-lm/1", *common, str(tmp_path / "registered.json")])
    trained = CausalLMModule.load_from_checkpoint(tiny_checkpoint, map_location="cpu")
    assert ran[0].tokenizer.to_dict() == trained.tokenizer.to_dict()
    assert ran[0].state_dict().keys() == trained.state_dict().keys()
    for k, v in trained.state_dict().items():
        torch.testing.assert_close(ran[0].state_dict()[k], v, rtol=0, atol=0, msg=k)
    monkeypatch.setattr(sys, "argv", ["zoo.gpt", "lm-eval", tiny_checkpoint, *common, str(tmp_path / "ckpt.json")])
    gpt_main.main()
    registered, local = (json.loads((tmp_path / f"{n}.json").read_text())["zoo_mc"] for n in ("registered", "ckpt"))
    assert registered["acc,none"] == local["acc,none"] and registered["acc_norm,none"] == local["acc_norm,none"]
    capsys.readouterr()
