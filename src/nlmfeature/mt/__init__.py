"""Machine translation: k-best lists, rescoring, BLEU, tuning, evaluation."""
