// Word lists and random pieces for the RULER-style prompts (ruler_words.h).
// The lists were written for topkv: common English nouns, adjectives and
// verbs (dictionary words, no names), standing in for the wonderwords lists
// RULER draws from. 333 nouns x 205 adjectives give 68,265 "adjective-noun"
// keys; the three lists give 664 distinct single words.
#include "src/eval/ruler_words.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "src/common/error.h"

namespace topkv::ruler {

namespace {

constexpr std::string_view kNouns[] = {
    "apple", "anchor", "arrow", "attic", "badge", "bakery", "balcony", "ball", "balloon", "banana", "barn", "basket",
    "beach", "beacon", "bean", "bear", "bell", "belt", "bench", "berry", "bicycle", "blanket", "boat", "bonnet",
    "book", "boot", "bottle", "boulder", "bowl", "box", "bracelet", "branch", "bread", "brick", "bridge", "broom",
    "bucket", "buffalo", "bush", "butter", "button", "cabin", "cable", "cactus", "cake", "camel", "camera", "candle",
    "canoe", "canyon", "cap", "carpet", "carrot", "castle", "cat", "cave", "cellar", "chair", "chalk", "cherry",
    "chimney", "church", "circle", "cliff", "clock", "cloud", "coat", "coin", "comet", "compass", "cookie", "copper",
    "corn", "cottage", "cotton", "couch", "crayon", "creek", "crown", "cup", "curtain", "cushion", "daisy", "desert",
    "desk", "diamond", "dinner", "dock", "doll", "dolphin", "door", "dragon", "drawer", "drum", "duck", "eagle",
    "engine", "envelope", "falcon", "feather", "fence", "fern", "ferry", "field", "flag", "flame", "flute", "forest",
    "fork", "fountain", "fox", "frog", "garden", "garlic", "gate", "giraffe", "glacier", "glove", "goat", "grape",
    "guitar", "hammer", "harbor", "hat", "hawk", "helmet", "hill", "honey", "horn", "hotel", "island", "jacket",
    "jar", "jelly", "jungle", "kettle", "key", "kitchen", "kite", "ladder", "lake", "lamp", "lantern", "lemon",
    "letter", "library", "lighthouse", "lily", "lion", "lizard", "locket", "magnet", "mango", "map", "maple",
    "marble", "market", "meadow", "mirror", "mitten", "monkey", "moon", "mountain", "muffin", "museum", "needle",
    "nest", "notebook", "oak", "ocean", "olive", "onion", "orange", "orchard", "otter", "owl", "paddle", "palace",
    "pancake", "parrot", "peach", "pearl", "pebble", "pencil", "pepper", "piano", "pigeon", "pillow", "pine",
    "planet", "plate", "pocket", "pond", "pony", "potato", "pumpkin", "puzzle", "rabbit", "radio", "raft", "railway",
    "rainbow", "raven", "ribbon", "river", "robin", "rocket", "roof", "rope", "rose", "saddle", "sail", "salmon",
    "sandal", "scarf", "school", "scissors", "shadow", "shell", "shelf", "ship", "shoe", "shovel", "silver", "skate",
    "sled", "snail", "spoon", "squirrel", "stable", "stair", "statue", "stone", "storm", "stove", "straw", "stream",
    "street", "sugar", "suitcase", "sunset", "swan", "sweater", "table", "teapot", "telescope", "temple", "tent",
    "thimble", "thunder", "ticket", "tiger", "timber", "tomato", "tower", "tractor", "trail", "train", "tree",
    "trumpet", "tulip", "tunnel", "turtle", "umbrella", "valley", "vase", "violin", "wagon", "wall", "walnut",
    "whale", "wheel", "whistle", "willow", "window", "wolf", "wool", "yard", "zebra", "acorn", "almond", "ant", "axe",
    "bamboo", "barrel", "bay", "beetle", "blossom", "bone", "bridle", "buckle", "canal", "cedar", "chestnut",
    "clover", "coral", "cricket", "dune", "ember", "fiddle", "fig", "gravel", "grove", "harp", "hedge", "ivy",
    "jasmine", "kayak", "lagoon", "lark", "linen", "mast", "mill", "moss", "oar", "parcel", "pasture", "quilt",
    "reef", "ridge", "satchel", "shore", "sparrow", "spruce", "thistle", "tide", "torch", "trunk", "velvet",
    "village", "vine", "wharf", "wren",
};
constexpr std::string_view kAdjectives[] = {
    "able", "ancient", "angry", "bold", "brave", "bright", "brisk", "broad", "busy", "calm", "careful", "cheerful",
    "chilly", "clean", "clever", "cloudy", "cold", "colorful", "cozy", "crisp", "curious", "damp", "dark", "deep",
    "delicate", "dusty", "eager", "early", "easy", "elegant", "empty", "faint", "fair", "famous", "fancy", "fast",
    "fierce", "flat", "fluffy", "fond", "fragile", "free", "fresh", "friendly", "frozen", "fuzzy", "gentle", "giant",
    "glad", "glossy", "golden", "graceful", "grand", "gray", "great", "green", "happy", "hardy", "heavy", "hidden",
    "hollow", "honest", "huge", "humble", "icy", "jolly", "keen", "kind", "large", "lazy", "light", "little",
    "lively", "lonely", "long", "loud", "lucky", "magic", "mellow", "merry", "mighty", "mild", "misty", "modern",
    "modest", "narrow", "neat", "nervous", "new", "nimble", "noble", "noisy", "odd", "old", "pale", "patient",
    "plain", "pleasant", "polite", "proud", "purple", "quick", "quiet", "rapid", "rare", "ready", "red", "rich",
    "round", "royal", "rusty", "sandy", "scarlet", "secret", "sharp", "shiny", "short", "shy", "silent", "silky",
    "simple", "sleepy", "slim", "slow", "small", "smooth", "snowy", "soft", "solid", "sour", "sparkling", "spicy",
    "steady", "steep", "sticky", "stormy", "strange", "strong", "sturdy", "sunny", "sweet", "swift", "tall", "tame",
    "tender", "thick", "thin", "tidy", "tiny", "tired", "tough", "tranquil", "tricky", "true", "vast", "vivid",
    "warm", "wavy", "weary", "wild", "windy", "wise", "witty", "wooden", "young", "zealous", "abundant", "amber",
    "azure", "bitter", "blue", "breezy", "brown", "crimson", "dizzy", "dry", "dull", "fading", "feisty", "gleaming",
    "grumpy", "hasty", "hungry", "ivory", "juicy", "lavish", "mossy", "muddy", "peaceful", "rosy", "rugged", "salty",
    "scenic", "serene", "shallow", "sleek", "snug", "spotted", "striped", "sunlit", "tangy", "timid", "violet",
    "wintry", "woolly",
};
constexpr std::string_view kVerbs[] = {
    "admire", "answer", "arrange", "arrive", "bake", "balance", "borrow", "bounce", "breathe", "build", "carry",
    "carve", "catch", "chase", "check", "cheer", "clean", "climb", "collect", "cook", "count", "cover", "crawl",
    "cross", "dance", "deliver", "describe", "dig", "discover", "draw", "dream", "drift", "drink", "drive", "enjoy",
    "explain", "explore", "fetch", "fill", "find", "fix", "float", "fold", "follow", "gather", "glide", "grow",
    "guard", "guide", "help", "hide", "hold", "hop", "hunt", "imagine", "invite", "jump", "knit", "knock", "laugh",
    "learn", "lift", "listen", "march", "measure", "mend", "mix", "move", "open", "order", "paint", "pack", "pass",
    "plant", "play", "polish", "pour", "practice", "prepare", "pull", "push", "read", "repair", "rest", "return",
    "ride", "roll", "row", "run", "scatter", "search", "sew", "share", "shout", "sing", "sketch", "skip", "sleep",
    "slide", "smile", "sort", "splash", "spin", "stack", "stir", "study", "sweep", "swim", "swing", "teach", "tend",
    "throw", "touch", "trace", "travel", "tumble", "visit", "wander", "wash", "watch", "wave", "weave", "whisper",
    "wonder", "wrap", "write", "yawn",
};

constexpr std::string_view kTimes[] = {"morning", "evening", "afternoon", "night", "winter", "summer",
                                       "spring", "autumn", "week", "season", "holiday", "festival"};

// Sentence patterns: {a} adjective, {n} noun, {v} verb, {t} a time of day or year.
constexpr std::string_view kPatterns[] = {
    "The {a} {n} rested near the {n} all through the {t}. ",
    "Every {t} someone would {v} the {n} beside the {a} {n}. ",
    "Nobody could say why the {n} seemed so {a} that {t}. ",
    "She wanted to {v} the {n} before the {t} was over. ",
    "In the {t}, the {n} by the {n} looked {a} and {a}. ",
    "He kept the {a} {n} on a shelf and never let anyone {v} it. ",
    "The old story tells of the {a} {n} that tried to {v} the {n}. ",
    "They walked past the {n} and the {n}, talking about the {a} {t}. ",
    "It is easier to {v} the {n} than to {v} the {n}. ",
    "The children learned to {v} the {n} with the {a} {n}. ",
    "Later that {t}, the {n} grew {a} and the {n} grew {a}. ",
    "A letter arrived asking them to {v} the {n} near the {n}. ",
    "The {n} was {a}, the {n} was {a}, and nobody minded. ",
    "On the way to the {n}, they stopped to {v} the {a} {n}. ",
    "The workers had to {v} the {n} twice because the {n} was too {a}. ",
    "Some say the {a} {n} can {v} the {n} if the {t} is {a} enough. ",
};

template <typename T, size_t N>
std::string_view pick(Rng& rng, const T (&a)[N]) {
  return a[below(rng, N)];
}

}  // namespace

std::span<const std::string_view> nouns() { return kNouns; }
std::span<const std::string_view> adjectives() { return kAdjectives; }
std::span<const std::string_view> verbs() { return kVerbs; }

uint64_t below(Rng& rng, uint64_t n) {
  TOPKV_CHECK(n >= 1, "internal: a random number below {}", n);
  return (uint64_t)(((unsigned __int128)rng() * n) >> 64);
}

double unit(Rng& rng) { return (double)(rng() >> 11) * 0x1.0p-53; }

std::vector<uint64_t> sample_distinct(Rng& rng, uint64_t n, uint64_t count) {
  TOPKV_CHECK(count <= n, "internal: {} distinct numbers below {}", count, n);
  std::vector<uint64_t> out;
  std::set<uint64_t> seen;
  while (out.size() < count) {  // count is small next to n wherever this is used, or equal to a small n
    const uint64_t x = below(rng, n);
    if (seen.insert(x).second) out.push_back(x);
  }
  return out;
}

uint64_t mix_seed(uint64_t seed, uint64_t salt) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (salt + 1);  // SplitMix64 (Steele, Lea, Flood 2014)
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string random_key_word(Rng& rng) {
  const std::string_view a = pick(rng, kAdjectives), n = pick(rng, kNouns);
  return std::string(a) + "-" + std::string(n);
}

std::string random_number(Rng& rng, int digits) {
  std::string s(1, (char)('1' + below(rng, 9)));
  for (int i = 1; i < digits; ++i) s += (char)('0' + below(rng, 10));
  return s;
}

std::string random_uuid(Rng& rng) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) {
    if (i == 8 || i == 12 || i == 16 || i == 20) s += '-';
    if (i == 12) s += '4';                               // version 4
    else if (i == 16) s += hex[8 + below(rng, 4)];       // variant 10xx
    else s += hex[below(rng, 16)];
  }
  return s;
}

std::string filler_sentence(Rng& rng) {
  const std::string_view pattern = pick(rng, kPatterns);
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '{') {
      out += pattern[i];
      continue;
    }
    switch (pattern[i + 1]) {  // "{x}"
      case 'a': out += pick(rng, kAdjectives); break;
      case 'n': out += pick(rng, kNouns); break;
      case 'v': out += pick(rng, kVerbs); break;
      default: out += pick(rng, kTimes); break;
    }
    i += 2;
  }
  return out;
}

std::vector<std::string> distinct_words(Rng& rng, size_t n) {
  std::vector<std::string> singles;
  std::set<std::string_view> seen;
  for (auto list : {nouns(), adjectives(), verbs()})
    for (std::string_view w : list)
      if (seen.insert(w).second) singles.emplace_back(w);
  shuffle(singles, rng);
  const size_t compounds = n > singles.size() ? n - singles.size() : 0;
  TOPKV_CHECK(compounds <= std::size(kAdjectives) * std::size(kNouns), "{} distinct words asked for; the lists "
              "give {}", n, singles.size() + std::size(kAdjectives) * std::size(kNouns));
  std::vector<std::string> out(singles.begin(), singles.begin() + (ptrdiff_t)std::min(n, singles.size()));
  std::set<std::string> taken;
  while (taken.size() < compounds) {
    std::string w = random_key_word(rng);
    if (taken.insert(w).second) out.push_back(std::move(w));
  }
  shuffle(out, rng);
  return out;
}

}  // namespace topkv::ruler
