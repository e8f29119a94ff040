"""Writes the tokenizer exactness vectors: tokenizer_text.txt (a varied UTF-8 test text)
and tokenizer_ids.txt (tiktoken's GPT-2 ids for it, one line, space separated).

tiktoken's encoding is built offline from the vendored encoder.json, so no download:
    pip install tiktoken
    python dev/test/vectors/make_tokenizer_vectors.py [--seed N] [--size BYTES] [--out DIR]
The text is deterministic for a given seed and size.
"""
import argparse
import json
import os
import random

import tiktoken

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
ENCODER_JSON = os.path.join(REPO, "dev", "data", "gpt2_encoder.json")
SHAKESPEARE = os.path.join(REPO, "dev", "data", "tiny_shakespeare.txt")
PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"

MULTI_SCRIPT = [
    "Café naïve façade résumé coöperate Ångström Øresund Łódź İstanbul ß ẞ",
    "Ελληνικά: Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο.",
    "Русский: Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "العربية: نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر ١٢٣٤٥٦٧٨٩٠",
    "עברית: דג סקרן שט בים מאוכזב ולפתע מצא חברה",
    "हिन्दी: ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम ०१२३४५६७८९",
    "ไทย: เป็นมนุษย์สุดประเสริฐเลิศคุณค่า ๑๒๓",
    "中文：我能吞下玻璃而不伤身体。日本語：いろはにほへと ちりぬるを カタカナ",
    "한국어: 키스의 고유조건은 입술끼리 만나야 하고 특별한 기술은 필요치 않다.",
    "Fullwidth: ＡＢＣ ａｂｃ ０１２３４５６７８９ and Roman numerals Ⅰ Ⅱ Ⅲ Ⅳ ⅻ ↂ",
    "Other numbers: ² ³ ¹ ¼ ½ ¾ ① ② ⑳ 𝟘𝟙𝟚 ৩ ៣ ፲ 〇 〡",
    "Combining: e\u0301 a\u0308 n\u0303 o\u0302\u0323 Z\u0351\u0352\u0353 \u0915\u094d\u0937",
    "Emoji: 👍 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇺🇸 🇯🇵 🇩🇪 ❤️ ☕ 🧑🏿‍💻 😀😃😄",
    "Math: ∀x∈ℝ, ∃y: x² + y² ≤ 1 ⇒ √(x·y) ≠ ∞; ∑ᵢ aᵢ ∫₀¹ f(t) dt",
    "Armenian Ա Բ Գ, Georgian ქართული, Ethiopic ሰላም, Cherokee ᏣᎳᎩ, Tamil தமிழ், Bengali বাংলা",
    "Tibetan བོད་ཡིག, Mongolian ᠮᠣᠩᠭᠣᠯ, Khmer ខ្មែរ, Lao ລາວ, Myanmar မြန်မာ, Sinhala සිංහල",
    "Zero width: a\u200bb c\u200cd e\u200df \ufeffBOM soft\u00adhyphen",
]

CODE_SNIPPETS = [
    "#include <stdio.h>\n\nint main(int argc, char** argv) {\n    for (int i = 0; i < argc; i++) {\n"
    "        printf(\"%d: %s\\n\", i, argv[i]);\n    }\n    return 0;\n}\n",
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
    "if __name__ == '__main__':\n\tprint([fib(i) for i in range(10)])  # tab-indented\n",
    "    x = {'key': \"value\", 'n': 3.14159e-10, 'list': [1,2,3]}\r\n    y = x['key'] if x else None\r\n",
    "<html>\n  <body class=\"main\">&nbsp;&amp;</body>\n</html>\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%o''s%';\n",
    "fn main() -> Result<(), Box<dyn Error>> { let v: Vec<u32> = (0..10).collect(); Ok(()) }\n",
]

CONTRACTIONS = [
    "I'll we've you're they'd she's it's I'm don't DON'T I'LL WE'VE YOU'RE He'S",
    "'s 's 'll 've 're 'd 'm 't 'S 'LL 'Ve rock'n'roll o'clock '''s ''ll .'s ,'re !'ve",
    "the cat's toy, the cats' toys, 'quoted', \"double\" isn't  aren't   wasn't",
]

WHITESPACE = [" ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", " \n", "\t\t", "\x0b",
              "\x0c", "\u00a0", "\u1680", "\u2000", "\u2003", "\u200a", "\u2028", "\u2029", "\u202f",
              "\u205f", "\u3000", "\x85", " \u00a0 ", "\n \n", "    ", "\t \t"]

# Small alphabet of characters that meet at the pattern's edge cases, for random mixing.
TRICKY = list(" \n\t'sdmtlvreSDLTVRE0123456789.,!?-_()\"") + [
    "\u00a0", "\u3000", "\u2003", "\r", "\x0b", "é", "ß", "Ω", "ж", "中", "٣", "Ⅻ", "²", "\u0301",
    "\u200d", "👍", "🏽", "🇺", "$", "€", "…", "\u00ad", "\x00", "\x7f"]

# Code-point blocks to draw random characters from (letters, numbers, marks, symbols,
# unassigned and private use), as (first, last).
BLOCKS = [(0x20, 0x7E), (0xA0, 0x24F), (0x250, 0x36F), (0x370, 0x52F), (0x530, 0x6FF), (0x700, 0x8FF),
          (0x900, 0xDFF), (0xE00, 0xFFF), (0x1000, 0x1FFF), (0x2000, 0x2BFF), (0x2C00, 0x2FFF),
          (0x3000, 0x33FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xA000, 0xABFF), (0xAC00, 0xD7FF),
          (0xE000, 0xF8FF), (0xF900, 0xFFFD), (0x10000, 0x1FFFF), (0x1F300, 0x1FAFF), (0x20000, 0x2FFFF),
          (0x30000, 0x3FFFF), (0xE0000, 0xE01EF), (0xF0000, 0x10FFFF)]


def gpt2_encoding():
    """tiktoken's gpt2 encoding, built from the vendored encoder.json."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
    unprintable = [b for b in range(256) if b not in printable]
    byte_of_char = {chr(b): b for b in printable}
    byte_of_char.update({chr(256 + k): b for k, b in enumerate(unprintable)})
    with open(ENCODER_JSON, encoding="utf-8") as f:
        encoder = json.load(f)
    ranks = {bytes(byte_of_char[ch] for ch in token): rank for token, rank in encoder.items() if token != EOT}
    return tiktoken.Encoding(name="gpt2", pat_str=PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: encoder[EOT]}, explicit_n_vocab=len(encoder))


def random_code_point(rng):
    while True:
        first, last = rng.choice(BLOCKS)
        cp = rng.randint(first, last)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def random_segment(rng, shakespeare):
    """One segment of the text, of a randomly chosen kind."""
    kind = rng.randrange(10)
    if kind == 0:
        start = rng.randrange(len(shakespeare) - 3000)
        return shakespeare[start:start + rng.randint(200, 3000)]
    if kind == 1:
        return rng.choice(MULTI_SCRIPT) + rng.choice(WHITESPACE)
    if kind == 2:
        return rng.choice(CODE_SNIPPETS)
    if kind == 3:
        return rng.choice(CONTRACTIONS) + rng.choice(WHITESPACE)
    if kind == 4:
        return "".join(rng.choice(WHITESPACE) if rng.random() < 0.3 else rng.choice(["word", "Word", "42", "!?", EOT])
                       for _ in range(rng.randint(5, 40)))
    if kind == 5:
        return "".join(chr(rng.randint(0x20, 0x7E)) for _ in range(rng.randint(20, 400)))
    if kind == 6:
        return "".join(random_code_point(rng) for _ in range(rng.randint(5, 200)))
    if kind == 7:
        return "".join(rng.choice(TRICKY) for _ in range(rng.randint(20, 400)))
    if kind == 8:
        return " ".join(str(rng.randint(0, 10 ** rng.randint(1, 30))) for _ in range(rng.randint(1, 20))) + "\n"
    return rng.choice(MULTI_SCRIPT).replace(" ", rng.choice(WHITESPACE)) + rng.choice(WHITESPACE)


def make_text(seed, size):
    rng = random.Random(seed)
    with open(SHAKESPEARE, encoding="utf-8") as f:
        shakespeare = f.read()
    segments, length = [], 0
    while length < size:
        segment = random_segment(rng, shakespeare)
        segments.append(segment)
        length += len(segment.encode("utf-8"))
    return "".join(segments)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--size", type=int, default=300_000, help="approximate text size in bytes")
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args()
    text = make_text(args.seed, args.size)
    ids = gpt2_encoding().encode_ordinary(text)
    with open(os.path.join(args.out, "tokenizer_text.txt"), "wb") as f:
        f.write(text.encode("utf-8"))
    with open(os.path.join(args.out, "tokenizer_ids.txt"), "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    print("%d bytes of text, %d tokens" % (len(text.encode("utf-8")), len(ids)))


if __name__ == "__main__":
    main()
