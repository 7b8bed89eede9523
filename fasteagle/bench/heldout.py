"""The mixed held-out set: six kinds of request, 24 prompts each, at the lengths users send them.

    python -m fasteagle.bench.heldout [--out assets/prompts/mix_heldout.jsonl]

Nothing here shares a source or a template with any training prompt (`fasteagle.train.tasks`, ShareGPT,
the library code prompts), nor with a public benchmark's questions:
- writing, qa, math: written for this file (the math problems are not the training templates' forms);
- translation: a prose paragraph (40-160 words) of an installed package's README, into one of five
  languages (training asked for three), under templates of their own;
- summarization and retrieval QA: a README's prose, 500-2,000 tokens of the default target's tokenizer,
  each package's README used once in the whole file; the questions ask about one of its own sections.
The READMEs are the package metadata of the pinned requirements (requirements-vllm.txt's environment);
each record names its source (`package==version`). The committed file is what the bench reads; this
command rebuilds it, and only in that environment byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import re

from fasteagle.bench.heldout_text import MATH, QA, WRITING

KINDS = ("writing", "translation", "summarization", "qa", "math", "rag")
N = 24
DOC_TOKENS = (500, 2000)  # the documents' length, in the default target's tokens
SKIP = {"fasteagle"}  # our own README: the project's text, not a user's
LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese")

TRANSLATE = ("Please translate this paragraph into {lang}.\n\n{text}",
             "{text}\n\nCan you put the text above into {lang}?",
             "I need this in {lang} for a colleague:\n\n{text}",
             "How would this read in {lang}?\n\n\"{text}\"")
SUMMARIZE = ("{doc}\n\nTL;DR of the text above, please.",
             "Here is a README I found:\n\n{doc}\n\nWhat is it about? Give me a short summary.",
             "Summarize this for a busy manager in three bullet points:\n\n{doc}",
             "Can you condense the following into one paragraph?\n\n{doc}")
ASK = ("Read the text and answer my question.\n\n{doc}\n\nMy question: {q}",
       "Based only on this page:\n\n{doc}\n\n{q}",
       "Context:\n{doc}\n\nQ: {q}\nA:",
       "{doc}\n\nUsing the documentation above, {q}")
QUESTIONS = ("what does it say about {section}?",
             "what should I know about {section}, according to it?",
             "summarize what the section on {section} explains.")


def _key(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def prose(text: str) -> list[str]:
    """A README's prose paragraphs, in order: code, tables, HTML, images and badges left out,
    links kept as their text, headings kept (as "# ...")."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", "", text)
    text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", text)
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = para.splitlines()
        if not lines or any(ln.startswith(("    ", "\t", "|", ">>>", "$ ", "..", "-- ")) for ln in lines):
            continue
        p = " ".join(ln.strip() for ln in lines).strip()
        if not p or set(p) <= set("=-*#~^_ ") or p.startswith(("[!", "=", ":")):
            continue
        if not p.startswith("#") and len(re.findall(r"[A-Za-z]{3,}", p)) < 6:
            continue
        out.append(p)
    return out


def readmes() -> list[tuple[str, list[str]]]:
    """(package==version, prose paragraphs) of each installed distribution, in a fixed order."""
    import importlib.metadata as md

    found = {}
    for d in md.distributions():
        name = d.metadata["Name"]
        if name in SKIP or name in found:
            continue
        desc = d.metadata.get_payload() or d.metadata.get("Description") or ""
        found[name] = (f"{name}=={d.version}", prose(desc))
    return [found[n] for n in sorted(found, key=_key)]


def document(paras: list[str], count) -> str | None:
    """The README's prose from its start, cut at a paragraph to at most DOC_TOKENS[1] tokens; None if
    it holds fewer than DOC_TOKENS[0] or hardly any sentences."""
    kept, n = [], 0
    for p in paras:
        c = count(p)
        if n + c > DOC_TOKENS[1]:
            break
        kept.append(p.lstrip("# ") if p.startswith("#") else p)
        n += c + 1
    body = [p for p in paras[:len(kept)] if not p.startswith("#")]
    if n < DOC_TOKENS[0] or len(body) < 4:
        return None
    return "\n\n".join(kept)


def sections(paras: list[str], doc: str) -> list[str]:
    """The headings inside `doc` that have prose under them, as a question names them."""
    names = []
    for i, p in enumerate(paras[:-1]):
        h = p.lstrip("# ").strip()
        if p.startswith("#") and h in doc and not paras[i + 1].startswith("#") and 2 < len(h) < 60:
            names.append(h)
    return names


def build(count) -> list[dict]:
    """Every record, in kind order. `count(text)` is the default target's token count."""
    rows = [{"id": f"writing-{i}", "category": "writing", "turns": [t]} for i, t in enumerate(WRITING)]
    rows += [{"id": f"qa-{i}", "category": "qa", "turns": [t]} for i, t in enumerate(QA)]
    rows += [{"id": f"math-{i}", "category": "math", "turns": [t]} for i, t in enumerate(MATH)]
    docs, passages = [], []
    for source, paras in readmes():
        doc = document(paras, count)
        if doc is not None and len(docs) < 2 * N:
            docs.append((source, paras, doc))
        elif len(passages) < N:
            fit = [p for p in paras if not p.startswith("#") and 40 <= len(p.split()) <= 160 and p[-1] in ".!?:"]
            if fit:
                passages.append((source, fit[0]))
    if len(docs) < 2 * N or len(passages) < N:
        raise RuntimeError(f"found {len(docs)} documents and {len(passages)} passages; need {2 * N} and {N}: "
                           "build in the environment of requirements-vllm.txt")
    for i, (source, text) in enumerate(passages):
        lang, form = LANGUAGES[i % len(LANGUAGES)], TRANSLATE[i % len(TRANSLATE)]
        rows.append({"id": f"translation-{i}", "category": "translation", "source": source,
                     "turns": [form.format(lang=lang, text=text)]})
    summ, rag = docs[0::2], docs[1::2]
    for i, (source, _, doc) in enumerate(summ):
        rows.append({"id": f"summarization-{i}", "category": "summarization", "source": source,
                     "turns": [SUMMARIZE[i % len(SUMMARIZE)].format(doc=doc)]})
    for i, (source, paras, doc) in enumerate(rag):
        names = sections(paras, doc)
        pkg = source.split("==")[0]
        q = (QUESTIONS[i % len(QUESTIONS)].format(section=f'"{names[i % len(names)]}"') if names
             else f"what is {pkg} for, and how is it used?")
        rows.append({"id": f"rag-{i}", "category": "rag", "source": source,
                     "turns": [ASK[i % len(ASK)].format(doc=doc, q=q)]})
    order = {k: i for i, k in enumerate(KINDS)}
    return sorted(rows, key=lambda r: order[r["category"]])


def main(argv: list[str] | None = None) -> int:
    from fasteagle.errors import Parser, run_command

    parser = Parser(prog="python -m fasteagle.bench.heldout", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="assets/prompts/mix_heldout.jsonl")
    args = parser.parse_args(argv)

    def go() -> int:
        from fasteagle.files import write_text
        from fasteagle.target import load_target

        tok = load_target(None, device="cpu").tokenizer
        rows = build(lambda s: len(tok(s)["input_ids"]))
        write_text(args.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        print(f"wrote {len(rows)} prompts to {args.out}")
        return 0

    return run_command(go)


if __name__ == "__main__":
    raise SystemExit(main())
