// The synthetic SentencePiece-style vocabulary (see synth.h). The order of
// pieces is the order of "frequency": scores fall by one per piece, so the
// score-ordered pair merging of a SentencePiece tokenizer prefers the pieces
// of common words over the filler n-grams and text tokenises into words.
#include <set>

#include "src/common/error.h"
#include "src/model/synth.h"

namespace topkv {

namespace {

constexpr const char* kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space

// Common English words, roughly by frequency.
const char* const kWords[] = {
    "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "with",
    "as", "I", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "not", "word",
    "but", "what", "some", "we", "can", "out", "other", "were", "all", "there", "when", "up", "use", "your",
    "how", "said", "an", "each", "she", "which", "do", "their", "time", "if", "will", "way", "about", "many",
    "then", "them", "write", "would", "like", "so", "these", "her", "long", "make", "thing", "see", "him",
    "two", "has", "look", "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most",
    "people", "my", "over", "know", "water", "than", "call", "first", "who", "may", "down", "side", "been",
    "now", "find", "any", "new", "work", "part", "take", "get", "place", "made", "live", "where", "after",
    "back", "little", "only", "round", "man", "year", "came", "show", "every", "good", "me", "give", "our",
    "under", "name", "very", "through", "just", "form", "sentence", "great", "think", "say", "help", "low",
    "line", "differ", "turn", "cause", "much", "mean", "before", "move", "right", "boy", "old", "too", "same",
    "tell", "does", "set", "three", "want", "air", "well", "also", "play", "small", "end", "put", "home",
    "read", "hand", "port", "large", "spell", "add", "even", "land", "here", "must", "big", "high", "such",
    "follow", "act", "why", "ask", "men", "change", "went", "light", "kind", "off", "need", "house",
    "picture", "try", "us", "again", "animal", "point", "mother", "world", "near", "build", "self", "earth",
    "father", "head", "stand", "own", "page", "should", "country", "found", "answer", "school", "grow",
    "study", "still", "learn", "plant", "cover", "food", "sun", "four", "between", "state", "keep", "eye",
    "never", "last", "let", "thought", "city", "tree", "cross", "farm", "hard", "start", "might", "story",
    "saw", "far", "sea", "draw", "left", "late", "run", "while", "press", "close", "night", "real", "life",
    "few", "north", "open", "seem", "together", "next", "white", "children", "begin", "got", "walk",
    "example", "ease", "paper", "group", "always", "music", "those", "both", "mark", "often", "letter",
    "until", "mile", "river", "car", "feet", "care", "second", "book", "carry", "took", "science", "eat",
    "room", "friend", "began", "idea", "fish", "mountain", "stop", "once", "base", "hear", "horse", "cut",
    "sure", "watch", "color", "face", "wood", "main", "enough", "plain", "girl", "usual", "young", "ready",
    "above", "ever", "red", "list", "though", "feel", "talk", "bird", "soon", "body", "dog", "family",
    "direct", "pose", "leave", "song", "measure", "door", "product", "black", "short", "numeral", "class",
    "wind", "question", "happen", "complete", "ship", "area", "half", "rock", "order", "fire", "south",
    "problem", "piece", "told", "knew", "pass", "since", "top", "whole", "king", "space", "heard", "best",
    "hour", "better", "true", "during", "hundred", "five", "remember", "step", "early", "hold", "west",
    "ground", "interest", "reach", "fast", "verb", "sing", "listen", "six", "table", "travel", "less",
    "morning", "ten", "simple", "several", "toward", "war", "lay", "against", "pattern", "slow", "center",
    "love", "person", "money", "serve", "appear", "road", "map", "rain", "rule", "govern", "pull", "cold",
    "notice", "voice", "unit", "power", "town", "fine", "certain", "fly", "fall", "lead", "cry", "dark",
    "machine", "note", "wait", "plan", "figure", "star", "box", "noun", "field", "rest", "correct", "able",
    "pound", "done", "beauty", "drive", "stood", "contain", "front", "teach", "week", "final", "gave",
    "green", "oh", "quick", "develop", "ocean", "warm", "free", "minute", "strong", "special", "mind",
    "behind", "clear", "tail", "produce", "fact", "street", "inch", "multiply", "nothing", "course", "stay",
    "wheel", "full", "force", "blue", "object", "decide", "surface", "deep", "moon", "island", "foot",
    "system", "busy", "test", "record", "boat", "common", "gold", "possible", "plane", "stead", "dry",
    "wonder", "laugh", "thousand", "ago", "ran", "check", "game", "shape", "equate", "hot", "miss",
    "brought", "heat", "snow", "tire", "bring", "yes", "distant", "fill", "east", "paint", "language",
    "among", "model", "token", "attention", "memory", "context", "index", "query", "key", "value", "layer",
    "The", "It", "In", "This", "He", "She", "We", "They", "What", "How", "A", "And", "But", "If", "When",
};
const char* const kSuffixes[] = {"s", "ed", "ing", "er", "ly", "es", "tion", "al", "est", "ment", "ness", "ful"};
const char kPunct[] = ".,!?'\"-:;()/&%$#@*+=[]{}<>_";

struct Builder {
  SynthVocab v;
  std::set<std::string> seen;
  size_t cap;
  float next_score = -1.f;
  bool full() const { return v.tokens.size() >= cap; }
  bool add(const std::string& text, int32_t type, float score) {
    if (full() || !seen.insert(text).second) return false;
    v.tokens.push_back(text);
    v.types.push_back(type);
    v.scores.push_back(score);
    return true;
  }
  void piece(const std::string& text) {
    if (add(text, 1, next_score)) next_score -= 1.f;
  }
  // text and every prefix of it (whole UTF-8 characters), shortest first
  void chain(const std::string& prefix, const std::string& word) {
    for (size_t k = 1; k <= word.size(); ++k) piece(prefix + word.substr(0, k));
  }
};

}  // namespace

int synth_min_vocab(std::string_view arch) {
  // specials + bytes + "▁" + letters/digits + punctuation + "▁x" pieces
  const int specials = arch == "gemma3" ? 107 : 3;
  return specials + 256 + 1 + 62 + (int)(sizeof(kPunct) - 1) + 26;
}

SynthVocab synth_vocab(std::string_view arch, int size) {
  TOPKV_CHECK(arch == "llama" || arch == "gemma3" || arch == "qwen2", "unknown architecture '{}' (llama, gemma3 or "
              "qwen2)", arch);
  TOPKV_CHECK(size >= synth_min_vocab(arch), "a {} vocabulary needs at least {} tokens (specials, 256 bytes, "
              "characters), got {}", arch, synth_min_vocab(arch), size);
  Builder b;
  b.cap = (size_t)size;
  if (arch != "gemma3") {  // llama's specials (qwen2 too: its synthetic vocabulary is SentencePiece-style)
    b.add("<unk>", 2, 0.f);
    b.add("<s>", 3, 0.f);
    b.add("</s>", 3, 0.f);
    b.v.unk = 0, b.v.bos = 1, b.v.eos = 2, b.v.pad = -1;
  } else {  // ids as in the real Gemma 3 vocabulary
    b.add("<pad>", 3, 0.f);
    b.add("<eos>", 3, 0.f);
    b.add("<bos>", 3, 0.f);
    b.add("<unk>", 2, 0.f);
    b.add("<mask>", 3, 0.f);
    b.add("[multimodal]", 4, 0.f);
    for (int i = 0; i < 99; ++i) b.add("<unused" + std::to_string(i) + ">", 5, 0.f);
    b.add("<start_of_turn>", 3, 0.f);  // 105
    b.add("<end_of_turn>", 3, 0.f);    // 106
    b.v.pad = 0, b.v.eos = 1, b.v.bos = 2, b.v.unk = 3;
  }
  for (int i = 0; i < 256; ++i) b.add(fmt::format("<0x{:02X}>", i), 6, 0.f);
  b.piece(kSpace);
  for (char c = 'a'; c <= 'z'; ++c) b.piece(std::string(1, c));
  for (char c = 'A'; c <= 'Z'; ++c) b.piece(std::string(1, c));
  for (char c = '0'; c <= '9'; ++c) b.piece(std::string(1, c));
  for (const char* p = kPunct; *p; ++p) b.piece(std::string(1, *p));
  for (char c = 'a'; c <= 'z'; ++c) b.piece(kSpace + std::string(1, c));
  // words: "▁word" chains, then the same without the space (a word at the
  // start of a text without a space prefix, or inside a longer word)
  for (const char* w : kWords) b.chain(kSpace, w);
  for (const char* s : kSuffixes) b.chain("", s);
  for (const char* w : kWords) b.chain("", w);
  // fill with letter n-grams; every n-gram is (n-1)-gram + letter, so all merge
  std::vector<std::string> grams(1, "");
  for (int n = 1; !b.full() && n <= 8; ++n) {
    std::vector<std::string> next;
    for (auto& g : grams)
      for (char c = 'a'; c <= 'z' && !b.full(); ++c) {
        next.push_back(g + c);
        b.piece(next.back());
        b.piece(kSpace + next.back());
      }
    grams.swap(next);
  }
  TOPKV_CHECK(b.full(), "internal: synthetic vocabulary ran out of pieces at {} tokens", b.v.tokens.size());
  return b.v;
}

}  // namespace topkv
