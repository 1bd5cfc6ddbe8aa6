"""Plumbing that no chapter teaches: model loading, tokenizer, workloads, CLI, homework tool, drawing."""
