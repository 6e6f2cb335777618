#!/usr/bin/env python3
"""Writes parity_corpus.json: the strings that tokenizer_parity_test encodes with k3 and with the
reference tokenizer (npm tiktoken). Deterministic; rerun after editing and commit the output.

  python3 tests/tokenizer/make_parity_corpus.py > tests/tokenizer/parity_corpus.json

Run it with Debian 12's python3 (Unicode 14.0, like PCRE2 10.42). "strings" are valid Unicode;
"invalid_utf8_hex" are byte strings (hex) that are not valid UTF-8: k3 encodes the bytes, the
oracle encodes what TextDecoder makes of them.
"""
import json
import random
import unicodedata

HANDWRITTEN = [
    # English, punctuation, contractions in every case.
    "Hello, world!",
    "The capital of France is",
    "I'm sure you'll see it's what they've said: we'd go, he's done, I'M, YOU'LL, IT'S.",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D 'Re 'Ve 'Ll 'rE 'vE 'lL",
    "don't DON'T Don'T dOn't can'T won'T shouldn'T couldn'T isn't ISN'T",
    "they're THEY'RE They'Re we've WE'VE We'Ve she'll SHE'LL She'Ll I'd I'D",
    "'s's's 'sss ''s 's' x's's xx'LLx 'll'll",
    "it\u2019s curly \u2018quotes\u2019 and \u201cdouble\u201d",
    "it'\u017f (long s) and K'\u212a (kelvin)",
    "ALLCAPS WORDS AND MixedCase CamelCaseWords iPhone eBay McDonald'S",
    "e.g. i.e. etc... U.S.A. Mr. Smith Jr. 3.14159 -42 +7 1e-10 0x1F",
    "   leading spaces",
    "trailing spaces    ",
    "tabs\tbetween\t\twords\t\t\t",
    "line\nbreaks\n\nand\n\n\nmore\n\n\n\n",
    "windows\r\nline\r\nendings\r\n\r\n",
    "mixed \r\n \n\r \t\n  \n\t x",
    "\n",
    " ",
    "  ",
    "\t",
    "\r",
    "\r\n",
    "\n\n\n",
    "a",
    "A",
    "1",
    ".",
    "!!!",
    "...",
    "?!?!",
    "----------",
    "==========",
    "**bold** _italic_ `code` ~~strike~~",
    "# Heading\n\n- item 1\n- item 2\n  - nested\n\n1. first\n2. second\n",
    "| col1 | col2 |\n|------|------|\n| a    | b    |\n",
    "> quote\n>> nested quote",
    "https://example.com/path?query=1&other=two#frag",
    "user@example.com, +1 (555) 123-4567",
    "C:\\Users\\name\\file.txt /usr/local/bin/python3 ~/.bashrc",
    # Digits.
    "1234567890",
    "12345678901234567890123456789012345678901234567890",
    "3.141592653589793238462643383279502884197169399375105820974944",
    "1,234,567.89 1 234 567,89 1'234'567",
    "2024-01-15T10:30:00Z 10:30:00.123456 +08:00",
    "\u0661\u0662\u0663 \u0967\u0968\u0969 \uff11\uff12\uff13 \u2460\u2461\u2462 \u00bd \u2153 \u216b",
    # Code.
    "def foo(x: int) -> int:\n    return x ** 2  # square\n",
    "class Foo:\n    def __init__(self):\n        self.x = {'a': [1, 2, 3]}\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "#include <vector>\nstd::vector<std::string> v{\"a\", \"b\"};\nauto it = v.begin();\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n    println!(\"{:?}\", v);\n}\n",
    "const f = async (a, b) => { await g(a ?? b); return a?.b?.[0]; };",
    "func main() {\n\tfmt.Println(\"hello\")\n\tx := map[string]int{\"a\": 1}\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "<div class=\"container\"><p id='x'>Text &amp; more</p></div>",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done\n",
    "public static void main(String[] args) { System.out.println(\"Hi\"); }",
    "x = [i**2 for i in range(10) if i % 2 == 0]; y = {k: v for k, v in d.items()}",
    "if (a && b || !c) { return a != b ? a : b; } else if (x <= y >= z) {}",
    "    indented with four spaces\n        eight spaces\n\t\ttwo tabs",
    "\\n \\t \\\\ \\\" \\u0041 \\x41",
    # JSON.
    '{"name": "k3", "version": 1, "tags": ["a", "b"], "nested": {"x": null, "y": true}}',
    '[\n  {\n    "id": 1,\n    "value": 3.5e-7\n  },\n  {\n    "id": 2,\n    "value": -0.0\n  }\n]',
    '{"emoji": "\\ud83d\\ude00", "cjk": "\u4e2d\u6587", "escaped": "a\\"b"}',
    # Chinese, including the spec's vector.
    "\u4e2d\u6587\u6d4b\u8bd5\uff1a\u4f60\u597d\u4e16\u754c",
    "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\u3002",
    "\u4eba\u5de5\u667a\u80fd\uff08AI\uff09\u662f\u8ba1\u7b97\u673a\u79d1\u5b66\u7684\u4e00\u4e2a\u5206\u652f\u3002",
    "\u300c\u5f15\u53f7\u300d\u3001\u987f\u53f7\u3001\u300a\u4e66\u540d\u53f7\u300b\u2014\u2014\u7834\u6298\u53f7\u2026\u2026",
    "\u4e2d\u6587English\u6df7\u5408mixed\u6587\u672ctext123\u6570\u5b57",
    "\u7b2c1\u7ae0 \u7b2c\u4e8c\u8282 2024\u5e741\u670815\u65e5",
    "\u3007\u3021\u3022\u3023 \u3005\u3005 \u4edd\u3005 \u2e80\u2e81 \u2f00\u2f01 \u31c0",
    "\U00020000\U00020001\U0002a700 \U0002b740 \U0002b820 \U0002ceb0",
    # Japanese: kanji runs next to kana.
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002",
    "\u6771\u4eac\u90fd\u6e0b\u8c37\u533a\u3067\u30e9\u30fc\u30e1\u30f3\u3092\u98df\u3079\u305f\u3044\u3067\u3059\u306d\uff01",
    "\u30ab\u30bf\u30ab\u30ca\u30fc\u30fc\u30fc \uff76\uff80\uff76\uff85 \u3072\u3089\u304c\u306a\u3099 \u304b\u309a",
    "\u79c1\u306fAI\u30a2\u30b7\u30b9\u30bf\u30f3\u30c8\u3067\u3059\u3002Python\u3067\u30b3\u30fc\u30c9\u3092\u66f8\u304d\u307e\u3059\u3002",
    # Korean: hangul, hanja, jamo.
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4. \u97d3\u570b\u8a9e\ud55c\uc790\u6df7\u7528",
    "\u1100\u1161\u11a8 \u3131\u314f \ud55c\uae00\u97d3\ud55c\uae00",
    # Other scripts.
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?",
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5 \u03a3\u03a3\u03a3\u03c2",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u0661\u0662\u0663",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd \u05d1\u05bc\u05b0\u05e8\u05b5\u05d0\u05e9\u05b4\u05c1\u05d9\u05ea",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0939\u093f\u0928\u094d\u0926\u0940",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01",
    "Xin ch\u00e0o th\u1ebf gi\u1edbi Ti\u1ebfng Vi\u1ec7t",
    "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0 \u0532\u0561\u0580\u0565\u0582 \u1230\u120b\u121d",
    "\u1e9e\u00df stra\u00dfe \u01c5\u01c8\u01cb \u1f88\u1f89 \u01c4\u01c6",
    "\U0001d400\U0001d401\U0001d482 \U0001d7ce\U0001d7cf math alphanumerics",
    # Combining marks.
    "e\u0301 a\u0300 n\u0303 o\u0308 caf\u00e9 cafe\u0301 na\u00efve nai\u0308ve",
    "Z\u0335\u0321\u0322\u0327a\u0338\u0328\u0321l\u0337\u0321\u0322g\u0336\u0327o\u0334\u0321 text",
    "\u0301\u0302\u0303 leading marks \u20dd\u20de",
    "A\u0301B\u0302C\u0303 ABC\u0301 a\u0301b\u0302c\u0303",
    "\u4e2d\u0301\u6587\u0302 \u3042\u3099",
    # Emoji.
    "\U0001f600\U0001f603\U0001f604 smile",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family",
    "\U0001f3f3\ufe0f\u200d\U0001f308 \U0001f3f4\u200d\u2620\ufe0f flags",
    "\U0001f44d\U0001f3fb\U0001f44d\U0001f3fc\U0001f44d\U0001f3fd\U0001f44d\U0001f3fe\U0001f44d\U0001f3ff",
    "\U0001f469\U0001f3fd\u200d\U0001f4bb \U0001f9d1\U0001f3ff\u200d\U0001f91d\u200d\U0001f9d1\U0001f3fb",
    "\U0001f1ef\U0001f1f5\U0001f1fa\U0001f1f8\U0001f1e8\U0001f1f3 regional indicators",
    "1\ufe0f\u20e3 #\ufe0f\u20e3 *\ufe0f\u20e3 \u2764\ufe0f \u263a\ufe0e",
    "I \u2764\ufe0f NY \U0001f5fd!!! \U0001f389\U0001f389\U0001f389",
    "\U0001f1ec\U0001f1e7\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
    # Whitespace of every kind.
    "a\u00a0b\u00a0\u00a0c",
    "\u3000\u3000\u5168\u89d2\u7a7a\u683c\u3000",
    "a\u2000b\u2001c\u2002d\u2003e\u2009f\u200ag\u202fh\u205fi",
    "line\u2028separator\u2029paragraph\u0085nel",
    "\u180e mongolian vowel separator \u180ex",
    "zero\u200bwidth\u200cnon\u200djoiner\u2060word\ufeffbom",
    "\x1c\x1d\x1e\x1f info separators \x1c",
    "\x0b vertical tab \x0c form feed \x0b\x0c",
    "\x00 nul \x01\x02\x07\x1b[0m escape",
    " \t \t \t ",
    "\t\t\t\t\t\t\t\t\t\t",
    "a" + " " * 50 + "b",
    " " * 100,
    "\n" * 30,
    "\r\n" * 20,
    " \n" * 20,
    "x" + "\t \n" * 10 + "y",
    "end with newline\n",
    "   \n   \n   ",
    # Special-token texts (o200k's, Kimi's and reserved names).
    "<|endoftext|>",
    "Hello<|endoftext|>world",
    "<|endoftext|><|endofprompt|><|endoftext|>",
    "  <|endoftext|>  ",
    "<|endoftext|",
    "<|endoftext|>>",
    "<<|endoftext|>",
    "<|reserved_token_199998|> <|reserved_token_200100|>",
    "[BOS][EOS]",
    "  <|end_of_msg|>  ",
    "<|open|>message role=\"user\"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>",
    "<|im_start|>user\nhello<|im_end|>",
]


def random_strings(rng):
    words = {
        "latin": ["the", "quick", "Brown", "FOX", "jumps", "over", "lazy", "dog's", "It'S",
                  "we'LL", "they've", "don't", "naïve", "Café", "résumé", "Straße", "ÆØÅ"],
        "han": ["中文", "测试", "你好", "世界", "人工智能", "模型", "推理", "引擎", "汉字", "𠀀𠀁"],
        "kana": ["ひらがな", "カタカナ", "です", "ます", "コンピューター", "ｶﾀｶﾅ"],
        "hangul": ["한국어", "안녕하세요", "세계", "텍스트"],
        "cyrillic": ["Привет", "мир", "ТЕКСТ", "Ёлка"],
        "greek": ["Γειά", "σου", "ΚΌΣΜΕ", "λόγος"],
        "arabic": ["مرحبا", "بالعالم"],
        "devanagari": ["नमस्ते", "हिन्दी"],
        "digits": ["0", "42", "123", "4567", "89012", "3.14", "1,000", "٣٤", "１２"],
        "punct": [".", ",", "!", "?", ":", ";", "...", "--", "—", "“", "”", "'", "\"", "(", ")",
                  "[", "]", "{", "}", "<", ">", "/", "\\", "|", "@", "#", "$", "%", "^", "&",
                  "*", "_", "+", "=", "~", "`", "。", "，", "、", "：", "！", "「", "」"],
        "emoji": ["😀", "👍🏽", "👨‍👩‍👧", "🏳️‍🌈", "❤️", "🇫🇷", "🤖", "✨"],
        "marks": ["\u0301", "\u0308", "\u0327", "\u20dd", "\u3099"],
        "space": [" ", "  ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "   ", " \n "],
    }
    kinds = list(words)
    out = []
    for i in range(260):
        length = rng.choice([1, 2, 3, 5, 8, 13, 21, 34, 55])
        parts = []
        for _ in range(length):
            kind = rng.choice(kinds)
            parts.append(rng.choice(words[kind]))
            if rng.random() < 0.5:
                parts.append(" ")
        out.append("".join(parts))
    # Long runs (below the 25,000-character chunking limit, which the oracle does not apply).
    out.append("a" * 3000)
    out.append("A" * 2000 + "b" * 2000)
    out.append(" " * 4000 + "x")
    out.append("\n" * 1000 + " " * 1000)
    out.append("7" * 5000)
    out.append("中" * 3000 + "文" * 100)
    out.append("ab" * 2500)
    out.append("😀" * 500)
    out.append("\u0301" * 1000)
    out.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(10000)))
    out.append("-" * 3000 + "=" * 3000)
    return out


def block_samples(rng):
    """Random code points from many blocks, in runs, so that each meets varied neighbours."""
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x250, 0x36F), (0x370, 0x52F), (0x530, 0x6FF),
              (0x900, 0xDFF), (0xE00, 0xEFF), (0x1100, 0x11FF), (0x1E00, 0x1FFF), (0x2000, 0x2BFF),
              (0x2E80, 0x2FDF), (0x3000, 0x30FF), (0x3100, 0x31FF), (0x3200, 0x33FF),
              (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xA000, 0xA4CF), (0xAC00, 0xD7A3),
              (0xF900, 0xFAFF), (0xFB00, 0xFFEF), (0x10000, 0x1014F), (0x1D400, 0x1D7FF),
              (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x20000, 0x2A6DF)]
    out = []
    for _ in range(80):
        chars = []
        for _ in range(rng.randint(5, 60)):
            lo, hi = rng.choice(blocks)
            c = chr(rng.randint(lo, hi))
            # Only characters assigned in Unicode 14 (PCRE2 10.42's tables): later additions get
            # their categories in the reference but are unassigned in PCRE2.
            if unicodedata.category(c) != "Cn":
                chars.append(c)
            if rng.random() < 0.2:
                chars.append(rng.choice([" ", "a", "A", "1", "'s", "\n", "'LL"]))
        out.append("".join(chars))
    return out


def invalid_utf8(rng):
    bad = [b"\xff", b"\xfe", b"\xc0\xaf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
           b"\x80", b"\xbf\xbf", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xf5", b"\xc2\x41"]
    good = ["hello", " world", "中文", "😀", "'s", "  ", "\n", "123", "<|endoftext|>", "é"]
    out = [b.hex() for b in bad]
    for _ in range(30):
        pieces = []
        for _ in range(rng.randint(1, 8)):
            pieces.append(rng.choice(bad) if rng.random() < 0.4 else rng.choice(good).encode())
        out.append(b"".join(pieces).hex())
    return out


def main():
    rng = random.Random(20260501)
    strings = HANDWRITTEN + random_strings(rng) + block_samples(rng)
    # Lone surrogates cannot be encoded as UTF-8 and would not survive the JSON round trip.
    strings = ["".join(c for c in s if not 0xD800 <= ord(c) <= 0xDFFF) for s in strings]
    corpus = {"strings": strings, "invalid_utf8_hex": invalid_utf8(rng)}
    print(json.dumps(corpus, ensure_ascii=False, indent=0))


if __name__ == "__main__":
    main()
