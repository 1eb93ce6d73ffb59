"""Does the input pipeline keep up? Tokens per second per host for each data path (`python -m hybrid_jax bench data`).

  python -m hybrid_jax bench data --config=base --config.data.seq_len=2048 \
      --tokenizers byte,tok/tokenizer.json,tok/sp.model --workers 0,2 --batches 20 \
      --compile-check cc.json --hosts 16

Paths: text tokenized on the fly with each tokenizer, and the same documents pretokenized (written once to a
temporary directory, then read as data.source='pretokenized'). Each row builds the training pipeline of the config
(one host of `--hosts`: its share of the global batch), takes one batch to start it and its workers, then times at
least `--batches` batches and `--min-seconds`. Headroom is that rate over the rate one host must deliver: the
step's consumption from `compile-check --json` (its roofline estimate of global tokens/s, divided by --hosts), or
`--tokens-per-s`. `--make-tokenizers DIR` trains a byte-level BPE tokenizer.json and a SentencePiece model on the
configured corpus first, so the comparison runs anywhere without downloads.
"""

import json
import os
import shlex
import tempfile
import time

from hybrid_jax import readers
from hybrid_jax.config import ConfigError, load_run
from hybrid_jax.data import catalog, pipeline, pretokenize


def _config(spec: str, overrides: list[str]):
  return load_run(shlex.join([spec, *overrides]))[2]


def required_tokens_per_s(compile_check_json: str | None, tokens_per_s: float | None, hosts: int) -> float | None:
  """Tokens/s one host must deliver: the fastest estimated step of a compile-check JSON / hosts, else the target."""
  if compile_check_json:
    rows = readers.read_json(compile_check_json, '--compile-check', expect=list,
                             hint='expected a list of compile-check rows (compile-check --json)')
    rates = [r['estimate']['tokens_per_s'] for r in rows if isinstance(r, dict) and isinstance(r.get('estimate'), dict)
             and 'tokens_per_s' in r['estimate']]
    if not rates:
      raise ConfigError(f'--compile-check {compile_check_json!r} holds no row with a step-time estimate (compile '
                        'for a TPU --topology, whose chip speed is known)')
    return max(rates) / hosts
  return tokens_per_s


def measure(config, batches: int, process_count: int, min_seconds: float = 0.0) -> dict:
  """Tokens/s of host 0's training batches (of process_count hosts) after the first batch: at least `batches`
  batches and at least `min_seconds` of them (fast paths need many batches for a stable rate)."""
  it = iter(pipeline.make_train_dataset(config, process_index=0, process_count=process_count))
  try:
    first = next(it)  # Starts the workers and fills their buffers: start-up, not throughput.
    per_batch, done = first['inputs'].size, 0
    start = time.perf_counter()
    while done < batches or time.perf_counter() - start < min_seconds:
      next(it)
      done += 1
    seconds = time.perf_counter() - start
  finally:
    if hasattr(it, 'close'):
      it.close()
  tokens = per_batch * done
  return {'batches': done, 'tokens': tokens, 'seconds': seconds, 'tokens_per_s': tokens / seconds}


def make_tokenizers(config, out_dir: str, max_documents: int = 2000) -> list[str]:
  """A byte-level BPE tokenizer.json (vocabulary 32,000) and a SentencePiece BPE model (8,000), trained on the
  first `max_documents` training documents of the configured source; returns their paths."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  os.makedirs(out_dir, exist_ok=True)
  source = catalog.make_source(config.data, 'train')
  texts = [source[i] for i in range(min(len(source), max_documents))]
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=32000, special_tokens=['<|endoftext|>'],
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  hf_path = os.path.join(out_dir, 'tokenizer.json')
  tok.save(hf_path)
  corpus = os.path.join(out_dir, 'sp_corpus.txt')
  with open(corpus, 'w', encoding='utf-8') as f:
    f.write('\n'.join(line for t in texts for line in t.splitlines() if line.strip()))
  spm.SentencePieceTrainer.train(input=corpus, model_prefix=os.path.join(out_dir, 'sp'), vocab_size=8000,
                                 model_type='bpe', input_sentence_size=200000, shuffle_input_sentence=True,
                                 minloglevel=2, eos_id=2, bos_id=1, unk_id=0)
  return [hf_path, os.path.join(out_dir, 'sp.model')]


def measure_paths(config, tokenizer_specs: list[str], workers: list[int], batches: int, hosts: int,
                  required: float | None, min_seconds: float = 0.0) -> list[dict]:
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for spec in tokenizer_specs:
      c = config.copy_and_resolve_references()
      c.data.tokenizer = spec
      c.model.vocab_size = max(c.model.vocab_size, pipeline.tokenizers.get_tokenizer(spec).vocab_size)
      pre = c.copy_and_resolve_references()
      pre.data.source, pre.data.paths = 'pretokenized', os.path.join(tmp, f'tok{len(rows)}')
      start = time.perf_counter()
      pretokenize.pretokenize(c, pre.data.paths)
      write_s = time.perf_counter() - start
      for path, cfg in (('on the fly', c), ('pretokenized', pre)):
        for n in workers:
          cfg.data.worker_count = n
          row = {'path': path, 'tokenizer': spec, 'workers': n, **measure(cfg, batches, hosts, min_seconds)}
          if path == 'pretokenized':
            row['pretokenize_s'] = write_s
          if required:
            row['headroom'] = row['tokens_per_s'] / required
          rows.append(row)
          print(_line(row), flush=True)
  return rows


def _line(r: dict) -> str:
  headroom = f"{r['headroom']:.2f}x" if 'headroom' in r else '-'
  name = os.path.basename(r['tokenizer'])
  return f"| {r['path']} | {name} | {r['workers']} | {r['tokens_per_s']:,.0f} | {headroom} |"


def run(args, overrides: list[str]) -> int:
  """The table of `args` (the flags of `bench data`, one attribute each) for the config of args.config with
  the --config.KEY=VALUE `overrides`."""
  config = _config(args.config, overrides)
  specs = [s for s in args.tokenizers.split(',') if s] or [config.data.tokenizer]
  for spec in specs:  # A bad tokenizer is refused before the table starts.
    pipeline.tokenizers.get_tokenizer(spec)
  if args.make_tokenizers:
    specs += make_tokenizers(config, args.make_tokenizers)
  workers = args.workers
  required = required_tokens_per_s(args.compile_check, args.tokens_per_s, args.hosts)
  need = f'; need {required:,.0f} tokens/s per host' if required else ''
  print(f'data bench: {config.data.source} corpus, seq_len {config.data.seq_len}, batch '
        f'{config.train.batch_size // args.hosts} per host (1 of {args.hosts}), {os.cpu_count()} CPUs, load '
        f'{os.getloadavg()[0]:.1f}, >= {args.batches} batches and {args.min_seconds:g} s per row{need}', flush=True)
  print('| path | tokenizer | workers | tokens/s per host | headroom |\n| --- | --- | --- | --- | --- |', flush=True)
  rows = measure_paths(config, specs, workers, args.batches, args.hosts, required, args.min_seconds)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'required_tokens_per_s': required, 'hosts': args.hosts, 'rows': rows}, f, indent=1)
  return 0
