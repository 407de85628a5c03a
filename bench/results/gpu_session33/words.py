# The prompt of the real-prefill runs: n words drawn from the synthetic vocabulary's first 16
# (src/model/synth_vocab.cpp) with Python's random.seed(1), as session 14's p512k.txt.
import random, sys
words = ["the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "with"]
random.seed(1)
n = int(sys.argv[1])
sys.stdout.write(" ".join(random.choice(words) for _ in range(n)) + "\n")
