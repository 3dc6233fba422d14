"""Build tests/rewards/data/math_corpus.jsonl: realistic completion / reference pairs with math-verify's verdict.

    .venv/bin/python tests/rewards/make_math_corpus.py          # rewrite the corpus (deterministic)
    .venv/bin/python tests/rewards/make_math_corpus.py --check  # exit 1 if the committed file is out of date

Each row: ``{"id", "category", "completion", "answer", "math_verify", "difference"}``. ``math_verify`` is 1 or 0:
math-verify's own verdict, computed by calling it directly the way its documentation does —
``verify(parse("\\boxed{" + answer + "}"), parse(completion))`` with its default extraction (LaTeX and plain
expressions). ``difference`` names an entry of ``p3o.rewards.DIFFERENCES`` when the row falls under a
deliberate difference of p3o's ``math`` verifier (`difference_of`: from the text and math-verify's parser, never
from p3o's verdict), else null.

The pairs are what models write for GSM8K / MATH-style problems: a short chain of thought, then the final answer in
one of many forms (units, thousands separators, percentages, fractions, ``\\dfrac`` / ``\\tfrac`` / ``\\frac34``,
mixed numbers, factorials, intervals, sets, equations, several boxes, ``\\fbox``, trailing periods, negative
numbers, scientific notation, degrees, LaTeX spacing, text answers, GSM8K's ``#### n``), each correct and wrong.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

PATH = Path(__file__).resolve().parent / "data" / "math_corpus.jsonl"

# Chains of thought the final answer follows (a few per row family, picked by index: deterministic).
LEADS = [
    "Let's think step by step. First we collect what we know, then combine it.\n\n",
    "We set up the equation from the problem statement and simplify both sides.\n",
    "Step 1: read the problem carefully.\nStep 2: compute.\n",
    "Using the given information, we substitute the values and evaluate.\n\n",
    "",
]
# How the box is presented (%s = the box, e.g. "\\boxed{12}").
FRAMES = [
    "Therefore, the final answer is $%s$.",
    "So the answer is %s.",
    "The answer is: %s",
    "\\[\n%s\n\\]",
    "%s",
    "Thus we get %s",
]

Row = tuple[str, str, str]  # (category, completion, answer)


def boxed(category: str, pairs: list[tuple[str, str]], wrong: list[tuple[str, str]] | None = None) -> Iterator[Row]:
    """Rows with the answer text `pred` in a `\\boxed{}` inside varied leads and frames: (pred, gold) pairs."""
    for k, (pred, gold) in enumerate(pairs + (wrong or [])):
        lead = LEADS[k % len(LEADS)]
        frame = FRAMES[(k // len(LEADS) + k) % len(FRAMES)]
        yield category, lead + frame % ("\\boxed{" + pred + "}"), gold


def rows() -> Iterator[Row]:
    """Every (category, completion, answer) of the corpus, in a fixed order."""
    # The table: correct answers math-verify accepts that p3o used to reject.
    yield "issue-table", "The answer is \\boxed{12 apples}", "12"
    yield "issue-table", "So \\boxed{5 hours}", "5"
    yield "issue-table", "\\boxed{3\\;\\text{m}}", "3"
    yield "issue-table", "\\boxed{3!}", "6"
    yield "issue-table", "\\boxed{0.5}", "50\\%"

    yield from boxed(
        "units",
        [
            ("12 apples", "12"),
            ("5 hours", "5"),
            ("3\\;\\text{m}", "3"),
            ("15\\text{ cm}", "15"),
            ("7 \\text{ dollars}", "7"),
            ("\\$12", "12"),
            ("\\$12.50", "12.5"),
            ("12\\text{ km}", "12"),
            ("20 \\text{ minutes}", "20"),
            ("8 feet", "8"),
            ("36\\text{ cm}^2", "36"),
            ("4\\text{ m/s}", "4"),
            ("60 \\mbox{ mph}", "60"),
            ("\\text{5 hours}", "5"),
            ("3~\\text{m}", "3"),
            ("9\\ \\text{inches}", "9"),
            ("25\\,\\text{kg}", "25"),
            ("1.5 \\text{ liters}", "1.5"),
            ("18 \\text{ students}", "18"),
            ("42\\textrm{ cookies}", "42"),
        ],
        [
            ("13 apples", "12"),
            ("6 hours", "5"),
            ("4\\;\\text{m}", "3"),
            ("\\$13", "12"),
            ("21 \\text{ minutes}", "20"),
            ("7 feet", "8"),
            ("19 \\text{ students}", "18"),
            ("2\\text{ m/s}", "4"),
        ],
    )
    yield from boxed(
        "thousands",
        [
            ("1,234", "1234"),
            ("1234", "1,234"),
            ("12,000", "12000"),
            ("1,000,000", "1000000"),
            ("1{,}234", "1234"),
            ("3{,}000", "3000"),
            ("3,\\!000", "3000"),
            ("3\\!000", "3000"),
            ("\\$1,200", "1200"),
            ("45,600", "45600"),
            ("1,234.5", "1234.5"),
            ("100{,}000", "10^5"),
        ],
        [
            ("1,235", "1234"),
            ("12,001", "12000"),
            ("3{,}001", "3000"),
            ("45,500", "45600"),
            ("1,243", "1234"),
        ],
    )
    yield from boxed(
        "percent",
        [
            ("50\\%", "50"),
            ("50\\%", "50\\%"),
            ("0.5", "50\\%"),
            ("25\\%", "0.25"),
            ("12.5\\%", "12.5\\%"),
            ("50", "50\\%"),
            ("20\\%", "\\frac{1}{5}"),
            ("75 \\%", "75\\%"),
            ("40\\text{\\%}", "40\\%"),
            ("33\\frac{1}{3}\\%", "\\frac13"),
        ],
        [
            ("5\\%", "50\\%"),
            ("0.05", "50\\%"),
            ("60\\%", "50"),
            ("2.5\\%", "25\\%"),
            ("26\\%", "0.25"),
        ],
    )
    yield from boxed(
        "fractions",
        [
            ("\\frac{1}{2}", "0.5"),
            ("1/2", "\\frac12"),
            ("\\frac{2}{4}", "\\frac{1}{2}"),
            ("-\\frac{3}{4}", "-0.75"),
            ("\\frac{-3}{4}", "-\\frac34"),
            ("\\frac{7}{3}", "\\frac73"),
            ("0.75", "\\frac{3}{4}"),
            ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"),
            ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}"),
            ("\\frac{10}{4}", "\\frac52"),
            ("3/8", "0.375"),
            ("\\frac{22}{7}", "\\frac{22}{7}"),
        ],
        [
            ("\\frac{1}{3}", "0.5"),
            ("\\frac{3}{4}", "-0.75"),
            ("2/3", "\\frac{3}{2}"),
            ("\\frac{\\sqrt{3}}{3}", "\\frac{\\sqrt3}{2}"),
            ("0.33", "\\frac13"),
        ],
    )
    yield from boxed(
        "dfrac-tfrac",
        [
            ("\\dfrac{1}{2}", "\\frac12"),
            ("\\tfrac{3}{4}", "0.75"),
            ("\\dfrac{5}{8}", "\\frac{5}{8}"),
            ("\\tfrac{1}{3}", "\\dfrac{1}{3}"),
            ("\\dfrac{\\pi}{4}", "\\frac{\\pi}{4}"),
            ("-\\dfrac{2}{3}", "-\\frac{2}{3}"),
            ("\\dfrac{9}{3}", "3"),
            ("\\tfrac{15}{2}", "7.5"),
        ],
        [
            ("\\dfrac{1}{4}", "\\frac12"),
            ("\\tfrac{4}{3}", "0.75"),
            ("\\dfrac{\\pi}{3}", "\\frac{\\pi}{4}"),
            ("\\dfrac{2}{3}", "-\\frac{2}{3}"),
        ],
    )
    yield from boxed(
        "frac-shorthand",
        [
            ("\\frac34", "\\frac{3}{4}"),
            ("\\frac12", "0.5"),
            ("\\dfrac34", "0.75"),
            ("\\tfrac12", "\\frac{1}{2}"),
            ("\\frac{3}4", "0.75"),
            ("-\\frac12", "-0.5"),
            ("\\frac1{\\sqrt2}", "\\frac{\\sqrt2}{2}"),
        ],
        [
            ("\\frac43", "\\frac{3}{4}"),
            ("\\frac13", "0.5"),
            ("\\frac12", "-0.5"),
        ],
    )
    yield from boxed(
        "mixed-numbers",
        [
            ("2\\frac{1}{2}", "2.5"),
            ("2\\frac{1}{2}", "\\frac52"),
            ("2 \\frac{1}{2}", "\\frac{5}{2}"),
            ("3\\tfrac{1}{4}", "3.25"),
            ("1\\dfrac{3}{4}", "\\frac74"),
            ("5\\frac{2}{3}", "\\frac{17}{3}"),
            ("10\\frac{1}{2}", "10.5"),
        ],
        [
            ("2\\frac{1}{3}", "2.5"),
            ("3\\tfrac{1}{2}", "3.25"),
            ("1\\dfrac{1}{4}", "\\frac74"),
            ("2\\frac{1}{2}", "\\frac{1}{2}"),
        ],
    )
    yield from boxed(
        "factorial",
        [
            ("3!", "6"),
            ("5!", "120"),
            ("4!", "24"),
            ("\\frac{10!}{8!}", "90"),
            ("6!", "720"),
            ("\\frac{5!}{2!3!}", "10"),
            ("0!", "1"),
            ("2\\cdot 3!", "12"),
            ("n!", "n!"),
            ("(n-1)!", "(n-1)!"),
        ],
        [
            ("4!", "25"),
            ("3!", "3"),
            ("5!", "100"),
            ("\\frac{10!}{8!}", "80"),
        ],
    )
    yield from boxed(
        "interval",
        [
            ("(1,2]", "(1,2]"),
            ("[0,\\infty)", "[0,\\infty)"),
            ("(-\\infty, 3)", "(-\\infty,3)"),
            ("(-\\infty,-1)\\cup(1,\\infty)", "(-\\infty,-1)\\cup(1,\\infty)"),
            ("[-2, 5]", "[-2,5]"),
            ("\\left(0, \\frac{1}{2}\\right)", "(0,\\frac12)"),
            ("x \\in [1, 4]", "[1,4]"),
            ("(-3,3)", "(-3, 3)"),
        ],
        [
            ("(1,2)", "(1,2]"),
            ("[0,\\infty)", "(0,\\infty)"),
            ("(-\\infty, 2)", "(-\\infty,3)"),
            ("[-2, 4]", "[-2,5]"),
        ],
    )
    yield from boxed(
        "set",
        [
            ("\\{1,2,3\\}", "\\{1,2,3\\}"),
            ("\\{3,1,2\\}", "\\{1,2,3\\}"),
            ("1, 2, 3", "\\{1,2,3\\}"),
            ("\\{-1, 1\\}", "\\{1,-1\\}"),
            ("2, -2", "-2,2"),
            ("\\{\\frac12, 2\\}", "\\{2, 0.5\\}"),
            ("\\emptyset", "\\emptyset"),
        ],
        [
            ("\\{1,2\\}", "\\{1,2,3\\}"),
            ("\\{1,2,4\\}", "\\{1,2,3\\}"),
            ("1, 2", "\\{1,2,3\\}"),
            ("\\{-1, 2\\}", "\\{1,-1\\}"),
        ],
    )
    yield from boxed(
        "equation",
        [
            ("x = 2", "2"),
            ("x=2", "x=2"),
            ("2", "x=2"),
            ("x = -5", "-5"),
            ("y = 3x + 1", "y=3x+1"),
            ("x = \\frac{1}{2}", "0.5"),
            ("a = 7", "7"),
            ("k = 12", "12"),
            ("y=2x-3", "2x-3"),
            ("x^2 + 2x + 1", "(x+1)^2"),
        ],
        [
            ("x = 3", "2"),
            ("y = 2", "x=2"),
            ("x = 5", "-5"),
            ("y = 3x - 1", "y=3x+1"),
            ("a = 8", "7"),
        ],
    )
    yield from boxed(
        "expression",
        [
            ("2\\pi", "2\\pi"),
            ("\\frac{\\pi}{2}", "\\pi/2"),
            ("\\sqrt{8}", "2\\sqrt{2}"),
            ("3\\sqrt{2}", "\\sqrt{18}"),
            ("(x+1)^2", "x^2+2x+1"),
            ("x^5+x^4+x^3+x^2+x+1", "\\frac{x^6-1}{x-1}"),
            ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
            ("(2, -1)", "(2,-1)"),
            ("2^{10}", "1024"),
            ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
            ("1+2i", "1+2i"),
            ("\\log_2 8", "3"),
        ],
        [
            ("\\pi", "2\\pi"),
            ("\\sqrt{6}", "2\\sqrt{2}"),
            ("(x-1)^2", "x^2+2x+1"),
            ("(2, 1)", "(2,-1)"),
            ("2^{9}", "1024"),
            ("1-2i", "1+2i"),
        ],
    )
    yield from boxed(
        "negative",
        [
            ("-7", "-7"),
            ("-3.5", "-\\frac72"),
            ("- 7", "-7"),
            ("-\\frac{1}{2}", "-0.5"),
            ("-12", "-12"),
            ("-0.25", "-\\frac{1}{4}"),
            ("(-1)", "-1"),
        ],
        [
            ("7", "-7"),
            ("-6", "-7"),
            ("3.5", "-\\frac72"),
            ("\\frac{1}{2}", "-0.5"),
        ],
    )
    yield from boxed(
        "scientific",
        [
            ("1.5\\times 10^{3}", "1500"),
            ("3 \\cdot 10^4", "30000"),
            ("2.5 \\times 10^{-3}", "0.0025"),
            ("6.02\\times10^{23}", "6.02\\times 10^{23}"),
            ("1.2 \\times 10^6", "1200000"),
            ("4\\times 10^{-2}", "0.04"),
            ("1e3", "1000"),
        ],
        [
            ("1.5\\times 10^{4}", "1500"),
            ("3 \\cdot 10^3", "30000"),
            ("2.5 \\times 10^{-2}", "0.0025"),
        ],
    )
    yield from boxed(
        "degrees",
        [
            ("30^\\circ", "30"),
            ("30^{\\circ}", "30^\\circ"),
            ("45^\\circ", "45^\\circ"),
            ("90", "90^\\circ"),
            ("120^{\\circ}", "120"),
            ("60 \\text{ degrees}", "60"),
            ("30°", "30"),
        ],
        [
            ("60^\\circ", "30"),
            ("45^{\\circ}", "135^\\circ"),
            ("90", "180^\\circ"),
        ],
    )
    yield from boxed(
        "spacing",
        [
            ("3\\,000", "3000"),
            ("3\\;\\text{m}", "3"),
            ("2\\!\\cdot\\!3", "6"),
            ("x~=~2", "2"),
            ("\\frac{1}{2}\\,", "0.5"),
            ("\\ 5", "5"),
            ("12\\,\\%", "12\\%"),
            ("1\\,234", "1234"),
            ("\\, 7 \\,", "7"),
            ("4\\quad", "4"),
            ("2 \\cdot 5", "10"),
        ],
        [
            ("3\\,001", "3000"),
            ("x~=~3", "2"),
            ("\\, 8 \\,", "7"),
            ("2\\!\\cdot\\!4", "6"),
        ],
    )
    yield from boxed(
        "text",
        [
            ("\\text{Monday}", "\\text{Monday}"),
            ("\\text{Monday}", "Monday"),
            ("\\text{(C)}", "\\text{(C)}"),
            ("C", "\\text{(C)}"),
            ("(B)", "B"),
            ("\\textbf{(B)}", "B"),
            ("\\text{yes}", "\\text{yes}"),
            ("\\text{even}", "\\text{even}"),
            ("\\text{Alice}", "\\text{Alice}"),
            ("A", "A"),
        ],
        [
            ("\\text{Tuesday}", "\\text{Monday}"),
            ("\\text{(D)}", "\\text{(C)}"),
            ("\\text{no}", "\\text{yes}"),
            ("\\text{odd}", "\\text{even}"),
            ("B", "A"),
        ],
    )
    # Several boxes: math-verify joins boxes that follow each other closely (or with "and", "or", ",") into one
    # answer, so a hedge is not the answer it contains; a box far before the last is ignored.
    for comp, gold in [
        ("The roots are \\boxed{3} and \\boxed{5}.", "3,5"),
        ("The roots are \\boxed{3} and \\boxed{5}.", "5"),
        ("It is either \\boxed{1} or \\boxed{2}.", "2"),
        ("\\boxed{1}, \\boxed{2}", "1, 2"),
        ("\\boxed{2}\\boxed{2}", "2"),
        (
            "First I got \\boxed{12}. Let me double-check the arithmetic of the second step once more.\n"
            "The corrected total is \\boxed{14}",
            "14",
        ),
        (
            "First I got \\boxed{12}. Let me double-check the arithmetic of the second step once more.\n"
            "The corrected total is \\boxed{14}",
            "12",
        ),
        ("First \\boxed{1}.\nWait, actually, the answer is \\boxed{2}.", "2"),
        ("We get \\boxed{1} then after more careful work \\boxed{2}", "2"),
        ("x = \\boxed{4} and y = \\boxed{-1}", "(4,-1)"),
        ("x = \\boxed{4} and y = \\boxed{-1}", "4,-1"),
        ("The smallest is \\boxed{2}; the largest is \\boxed{9}", "9"),
        (
            "Part (a): \\boxed{6}.\n\nFor part (b) we need to recompute everything from the start with the new data.\n"
            "Part (b): \\boxed{10}",
            "10",
        ),
    ]:
        yield "multiple-boxed", comp, gold
    # \fbox: a box to a reader; math-verify reads \fbox only next to a \boxed.
    for comp, gold in [
        ("The answer is \\fbox{12}.", "12"),
        ("So the total is \\fbox{72}", "72"),
        ("\\fbox{\\frac{1}{2}}", "0.5"),
        ("The answer is \\fbox{13}.", "12"),
        ("\\fbox{x = 3}", "3"),
    ]:
        yield "fbox", comp, gold
    yield from boxed(
        "trailing-period",
        [
            ("12.", "12"),
            ("7.", "7"),
            ("\\frac{1}{2}.", "0.5"),
            ("x = 2.", "2"),
        ],
        [("13.", "12")],
    )
    for comp, gold in [
        ("The final answer is $\\boxed{12}$.", "12"),
        ("Hence the answer is \\boxed{0.5}.", "\\frac12"),
        ("So we conclude \\boxed{42}.", "42"),
        ("So we conclude \\boxed{41}.", "42"),
        ("#### 72.", "72"),
    ]:
        yield "trailing-period", comp, gold
    # GSM8K's format: a worked solution, then "#### n".
    gsm = [
        (
            "Natalia sold 48/2 = 24 clips in May.\n"
            "Natalia sold 48+24 = 72 clips altogether in April and May.\n#### 72",
            "72",
        ),
        ("Weng earns 12/60 = $0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $10.\n#### 10", "10"),
        (
            "In the beginning, Betty has only 100 / 2 = $50.\nBetty's grandparents gave her 15 * 2 = $30.\n"
            "This means, Betty needs 100 - 50 - 30 - 15 = $5 more.\n#### 5",
            "5",
        ),
        (
            "Maila read 12 x 2 = 24 pages today.\nSo she was able to read a total of 12 + 24 = 36 pages since "
            "yesterday.\nThere are 120 - 36 = 84 pages left to be read.\n"
            "Since she wants to read half of the remaining pages tomorrow, "
            "then she should read 84/2 = 42 pages.\n#### 42",
            "42",
        ),
        (
            "He writes each friend 3*2=6 pages a week\nSo he writes 6*2=12 pages every week\nThat means he writes "
            "12*52=624 pages a year\n#### 624",
            "624",
        ),
        ("The total cost is 1,200 + 34 = 1,234 dollars.\n#### 1,234", "1234"),
        ("The total cost is 1200 + 34 = 1234 dollars.\n#### 1234", "1,234"),
        ("Each ticket costs $15.00, so she pays 15.\n#### $15", "15"),
        ("The price per pound is 7.5 dollars.\n#### 7.50", "7.5"),
        ("He loses 3 - 5 = -2 points.\n#### -2", "-2"),
        ("Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 73", "72"),
        ("Weng earns 12/60 = $0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $10.\n#### 12", "10"),
        ("He writes 12*52=624 pages a year\n#### 642", "624"),
        ("The total cost is 1,200 + 35 = 1,235 dollars.\n#### 1,235", "1234"),
        ("So the answer is 18.\n#### 18", "18"),
        ("So the answer is 17.\n#### 18", "17"),
        ("The answer is $\\frac{1}{2}$ of the 6 cakes, so 3 cakes.\n#### 3", "3"),
        ("Half of 10 is 5.\n#### 5\nThe answer is 5 apples.", "5"),
        ("She needs 40% of 50 = 20 more.\n#### 20", "20"),
        ("There are 3 boxes with 12 eggs each, so 3 * 12 = 36 eggs.\nShe uses 6, leaving 36 - 6 = 30.\n#### 30", "30"),
        ("There are 3 boxes with 12 eggs each, so 3 * 12 = 36 eggs.\nShe uses 6, leaving 36 - 6 = 30.\n#### 36", "30"),
        ("The train travels 60 * 2.5 = 150 miles.\n#### 150", "150"),
        ("Tom has 5 + 8 = 13 marbles, then gives away 4: 13 - 4 = 9.\n#### 9", "9"),
        ("Tom has 5 + 8 = 13 marbles, then gives away 4: 13 - 4 = 9.\n#### 13", "9"),
        ("The discount is 0.2 * 250 = 50, so the price is 250 - 50 = 200.\n#### 200", "200"),
        ("Total = 2,500 + 1,500 = 4,000\n#### 4,000", "4000"),
        ("Total = 2,500 + 1,500 = 4,000\n#### 4000", "4,000"),
        ("Average = (80 + 90 + 100) / 3 = 90\n#### 90", "90"),
        ("Average = (80 + 90 + 100) / 3 = 90\n#### 85", "90"),
        ("She saves $12.50 per week for 4 weeks: 12.5 * 4 = 50\n#### 50", "50"),
    ]
    for comp, gold in gsm:
        yield "gsm8k-hash", comp, gold
    yield from boxed(
        "money",
        [
            ("\\$5", "5"),
            ("\\$5.00", "5"),
            ("5 \\text{ dollars}", "\\$5"),
            ("\\$0.75", "0.75"),
            ("\\$1,050", "1050"),
            ("\\$ 18", "18"),
        ],
        [
            ("\\$6", "5"),
            ("\\$0.70", "0.75"),
            ("\\$1,500", "1050"),
        ],
    )
    yield from boxed(
        "decimals",
        [
            (".5", "0.5"),
            ("0.50", "\\frac12"),
            ("2.0", "2"),
            ("3.14", "3.14"),
            ("0.125", "\\frac18"),
            ("1.25", "\\frac54"),
            ("+5", "5"),
            ("007", "7"),
        ],
        [
            ("0.3333", "\\frac13"),
            ("3.15", "3.14"),
            ("0.12", "\\frac18"),
            ("2.1", "2"),
        ],
    )
    # Longer MATH-style solutions ending in a box.
    math_cot = [
        (
            "We complete the square: $x^2 - 6x + 13 = (x-3)^2 + 4$. The minimum value is attained at $x = 3$, "
            "so the minimum is $\\boxed{4}$.",
            "4",
        ),
        (
            "The sum of the interior angles of a hexagon is $180(6-2) = 720$ degrees, so each angle of a regular "
            "hexagon measures $\\boxed{120^\\circ}$.",
            "120",
        ),
        (
            "By the quadratic formula, $x = \\frac{-b \\pm \\sqrt{b^2-4ac}}{2a} = \\frac{5 \\pm 1}{2}$, so the "
            "solutions are $x = 2$ and $x = 3$. Their product is $\\boxed{6}$.",
            "6",
        ),
        (
            "There are $\\binom{5}{2} = 10$ ways to choose the pair, and $2$ of them work. The probability is "
            "$\\frac{2}{10} = \\boxed{\\frac{1}{5}}$.",
            "\\frac15",
        ),
        (
            "There are $\\binom{5}{2} = 10$ ways to choose the pair, and $3$ of them work. The probability is "
            "$\\boxed{\\frac{3}{10}}$.",
            "\\frac15",
        ),
        ("Since $f(2) = 2^2 + 1 = 5$, we get $f(f(2)) = f(5) = 26$. \\boxed{26}", "26"),
        ("Since $f(2) = 2^2 + 1 = 5$, we get $f(f(2)) = f(5) = 25$. \\boxed{25}", "26"),
        ("The inequality $|x - 1| < 3$ means $-3 < x - 1 < 3$, i.e. $\\boxed{(-2, 4)}$.", "(-2,4)"),
        ("The inequality $|x - 1| \\le 3$ means $-3 \\le x - 1 \\le 3$, i.e. $\\boxed{[-2, 4]}$.", "(-2,4)"),
        ("The distance is $\\sqrt{(4-1)^2 + (6-2)^2} = \\sqrt{25} = \\boxed{5}$ units.", "5"),
        ("Let the number be $n$. Then $3n + 4 = 19$, so $n = \\boxed{5}$.", "5"),
        ("The area of the circle is $\\pi r^2 = 9\\pi$.\n\n**Final Answer**\n\\[\n\\boxed{9\\pi}\n\\]", "9\\pi"),
        ("The area of the circle is $\\pi r^2 = 9\\pi$.\n\n**Final Answer**\n\\[\n\\boxed{6\\pi}\n\\]", "9\\pi"),
        ("The slope is $\\frac{7-3}{4-2} = 2$, so the line is $\\boxed{y = 2x - 1}$.", "y=2x-1"),
        ("Dividing, $\\frac{84}{12} = 7$, so each friend gets $\\boxed{7}$ marbles.", "7"),
        ("The remainder when $2^{10} = 1024$ is divided by $7$ is $\\boxed{2}$.", "2"),
        ("The remainder when $2^{10} = 1024$ is divided by $7$ is $\\boxed{3}$.", "2"),
        ("Thus $\\cos 60^\\circ = \\boxed{\\dfrac{1}{2}}$.", "\\frac{1}{2}"),
        ("The median of $\\{1, 3, 3, 7, 9\\}$ is $\\boxed{3}$.", "3"),
        ("Adding the equations gives $2x = 10$, so $(x, y) = \\boxed{(5, 2)}$.", "(5,2)"),
    ]
    for comp, gold in math_cot:
        yield "math-cot", comp, gold
    # No final-answer marker: math-verify falls back to the last number or LaTeX of the text; p3o does not.
    for comp, gold in [
        ("The answer is 72.", "72"),
        ("So the total is $\\frac{1}{2}$.", "0.5"),
        ("I think it is 5 hours.", "5"),
        ("The answer is 71.", "72"),
        ("First 3 + 4 = 7, then 7 * 2 = 14.", "14"),
        ("We find $x = 2$.", "2"),
    ]:
        yield "no-marker", comp, gold


_HASH = re.compile(r"####[ \t]*\$?[ \t]*([-+]?[0-9][0-9,]*(?:\.[0-9]+)?)")


def difference_of(completion: str) -> str | None:
    """The deliberate difference (a key of ``p3o.rewards.DIFFERENCES``) a completion falls under, decided from its
    text and math-verify's own parser alone (never from p3o's verdict); None for the pairs p3o must agree on.

    no-marker: no `\\boxed`, `\\fbox` or `####`. fbox: an `\\fbox` and no `\\boxed`. hash: `####` and no box,
    and math-verify extracts something other than the number after `####`. unreadable-box: a `\\boxed` answer that
    math-verify's LaTeX extraction cannot turn into an expression.
    """
    from math_verify import LatexExtractionConfig, parse

    has_box = "\\boxed" in completion
    if not has_box and "\\fbox" in completion:
        return "fbox"
    hashed = _HASH.search(completion)
    if not has_box and hashed is None:
        return "no-marker"
    if not has_box:
        assert hashed is not None
        extracted = parse(completion)
        number = hashed.group(1).replace(",", "")
        return None if extracted and extracted[-1].replace(",", "") == number else "hash"
    latex = parse(completion, [LatexExtractionConfig()])
    return None if any(not isinstance(x, str) for x in latex) else "unreadable-box"


def math_verify_verdict(completion: str, answer: str) -> int:
    """math-verify's verdict, called directly: verify(parse("\\boxed{answer}"), parse(completion)) -> 0 or 1."""
    from math_verify import parse, verify

    return int(bool(verify(parse("\\boxed{" + answer + "}"), parse(completion))))


def build() -> list[dict[str, object]]:
    """The corpus rows, math-verify's verdict included (a few seconds: math-verify runs in this process)."""
    import logging

    logging.disable(logging.WARNING)  # math-verify logs every unparsable answer
    out = []
    for i, (category, completion, answer) in enumerate(rows()):
        out.append(
            {
                "id": i,
                "category": category,
                "completion": completion,
                "answer": answer,
                "math_verify": math_verify_verdict(completion, answer),
                "difference": difference_of(completion),
            }
        )
    return out


def dumps(corpus: list[dict[str, object]]) -> str:
    """The file's text: one JSON object per line."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in corpus)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed corpus differs from a rebuild")
    args = ap.parse_args(argv)
    text = dumps(build())
    if args.check:
        same = PATH.is_file() and PATH.read_text() == text
        print(f"{PATH}: {'up to date' if same else 'OUT OF DATE: rerun without --check'}")
        return 0 if same else 1
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_text(text)
    rows_ = text.count("\n")
    print(f"wrote {PATH} ({rows_} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
