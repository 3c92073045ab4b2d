"""kiln's benchmark suite: eager vs torch.compile vs kiln, one JSON line per case.

    python -m benchmarks.run [--device cuda|cpu] [--quick] [--cases seed,linear] [--out FILE.jsonl]
"""
