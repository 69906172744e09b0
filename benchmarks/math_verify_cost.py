"""What scoring one math response costs on this host: Hugging Face Math-Verify called as NeMo-RL's math
environment calls it (HFVerifyWorker: ``math_metric`` with LaTeX extraction of the gold ``\\boxed{...}``
and expression-or-LaTeX extraction of the response), on synthetic step-by-step responses.

    python -m pip install math-verify    # not a dependency of throughputlab
    python benchmarks/math_verify_cost.py [--responses 60] [--lengths 200,800,3000]

Prints, per response length, the median, mean and largest time of one call, for responses that end in a
boxed answer (equal to the gold, equal in another form, or wrong) and for responses cut before it (no
boxed answer: every LaTeX span is tried). The first call of a process (parser set-up) is timed apart.
Synthetic responses are clean; real ones carry more LaTeX per answer and the odd expression sympy is slow
on (math-verify's own timeouts), so this is a floor for what ``shape.reward.per_response_s`` should be.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import time

# (gold, the same value written another way, a wrong value)
ANSWERS = [("12", "\\frac{24}{2}", "13"), ("\\frac{3}{4}", "0.75", "\\frac{4}{3}"), ("2\\sqrt{3}", "\\sqrt{12}", "3\\sqrt{2}"),
           ("(1, 2)", "(1,2)", "(2, 1)"), ("x^2+1", "1+x^2", "x^2-1"), ("\\frac{\\pi}{6}", "\\frac{\\pi}{6}", "\\frac{\\pi}{3}"),
           ("-7", "-7", "7"), ("\\{1,2,3\\}", "\\{3,2,1\\}", "\\{1,2\\}"), ("45^\\circ", "45^\\circ", "30^\\circ")]
STEPS = ["We have $x^2 - 5x + 6 = 0$, so $(x-2)(x-3)=0$.", "Then $\\frac{a}{b} = \\frac{3}{4}$ and $a+b=7$.",
         "By the Pythagorean theorem, $c = \\sqrt{a^2+b^2} = \\sqrt{12}$.",
         "The sum is $\\sum_{k=1}^{n} k = \\frac{n(n+1)}{2}$.", "Computing step by step: 3 * 4 = 12, then 12 / 2 = 6.",
         "Therefore the area is $\\pi r^2 = 9\\pi$.", "Substituting $y = 2x + 1$ gives $x^2 + (2x+1)^2 = 10$.",
         "Since $\\sin^2\\theta + \\cos^2\\theta = 1$, we get $\\cos\\theta = \\frac{\\sqrt{3}}{2}$."]


def response(rng: random.Random, tokens: int, answer: str | None) -> str:
    parts, n = [], 0
    while n < tokens:
        s = rng.choice(STEPS)
        parts.append(s)
        n += len(s) // 4  # about four characters a token
    if answer is not None:
        parts.append(f"The final answer is $\\boxed{{{answer}}}$.")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--responses", type=int, default=60, help="responses timed per length and kind")
    ap.add_argument("--lengths", default="200,800,3000", help="response lengths in tokens")
    args = ap.parse_args(argv)
    try:
        from math_verify.metric import math_metric
        from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
    except ImportError:
        print("math-verify is not installed: python -m pip install math-verify", file=sys.stderr)
        return 2
    from importlib.metadata import version

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    verify = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                         pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
    rng = random.Random(0)

    def timed(gold: str, pred: str) -> float:
        t = time.perf_counter()
        try:
            verify(["\\boxed{" + gold + "}"], [pred])
        except BaseException:  # math-verify's TimeoutException is a BaseException
            pass
        return time.perf_counter() - t

    print(f"math-verify {version('math-verify')}; first call (set-up): "
          f"{timed('1', response(rng, 50, '1')) * 1e3:.0f} ms")
    print(f"{'tokens':>6}  {'response ends in':<22} {'median ms':>9} {'mean ms':>8} {'max ms':>8}")
    for tokens in (int(x) for x in args.lengths.split(",")):
        for kind in ("the gold", "the gold, other form", "a wrong answer", "no boxed answer"):
            times = []
            for i in range(args.responses):
                gold, other, wrong = ANSWERS[i % len(ANSWERS)]
                answer = {"the gold": gold, "the gold, other form": other, "a wrong answer": wrong}.get(kind)
                times.append(timed(gold, response(rng, tokens, answer)))
            print(f"{tokens:>6}  {kind:<22} {statistics.median(times) * 1e3:9.1f} {statistics.mean(times) * 1e3:8.1f} "
                  f"{max(times) * 1e3:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
