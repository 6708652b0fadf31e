#!/usr/bin/env python3
"""Lists the C++ functions longer than a limit, longest first.

    scripts/long_functions.py [--max N] FILE...

A function's length is its physical lines, from the line where its signature starts to the line
of its closing brace (comments and blank lines included). Exits 1 when any function is over the
limit, so the script can serve as a check. It matches braces after blanking comments and string
and character literals; it is not a C++ parser, but it knows what the code in src/ uses:
namespaces, classes and structs (their inline member functions count), constructor initializer
lists, lambdas (counted in the function that contains them), and brace initializers of variables
(not functions).
"""
import argparse
import re
import signal
import sys

CONTROL = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignof", "static_assert"}


def blank_comments_and_literals(text):
    """The text with comments, string and character literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            # A digit separator (1'000) is not a character literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else " " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching_brace(code, open_at):
    depth = 0
    for k in range(open_at, len(code)):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(code) - 1


def top_level_outside_parens(head, pattern):
    """Whether `pattern` (a regex) occurs in `head` outside (), [] and <> nesting."""
    depth = 0
    flat = []
    for ch in head:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        flat.append(ch if depth == 0 else " ")
    return re.search(pattern, "".join(flat)) is not None


def function_name(head):
    """The name before the parameter list of a function head, or None."""
    head = re.sub(r"\s+", " ", head).strip()
    m = re.search(r"(operator\s*(?:\(\)|[^\s(]+)|~?[A-Za-z_]\w*(?:\s*<[^(){};]*>)?)\s*\(", head)
    if not m:
        return None
    # The qualified name: Class::name, ns::Class<T>::name.
    start = m.start()
    qual = re.search(r"((?:[A-Za-z_]\w*(?:<[^(){};]*>)?::)*)$", head[:start])
    return (qual.group(1) if qual else "") + m.group(1).strip()


def skip_initializer_list(code, at):
    """From just after a constructor's ':', the position of the body's '{'."""
    n = len(code)
    while at < n:
        m = re.compile(r"\s*[A-Za-z_][\w:<>, ]*?\s*([({])").match(code, at)
        if not m:
            return None
        open_at = m.end(1) - 1
        close = {"(": ")", "{": "}"}[code[open_at]]
        depth, k = 0, open_at
        while k < n:
            if code[k] == code[open_at]:
                depth += 1
            elif code[k] == close:
                depth -= 1
                if depth == 0:
                    break
            k += 1
        at = k + 1
        rest = re.compile(r"\s*(,|\{)").match(code, at)
        if not rest:
            return None
        if rest.group(1) == "{":
            return rest.end(1) - 1
        at = rest.end(1)
    return None


def functions(code):
    """(name, first line, last line) of every function body in blanked code."""
    found = []
    line_of = [0] * (len(code) + 1)
    line = 1
    for k, ch in enumerate(code):
        line_of[k] = line
        if ch == "\n":
            line += 1
    line_of[len(code)] = line

    def scan(begin, end):
        k = begin
        head_start = begin
        while k < end:
            ch = code[k]
            if ch in ";}":
                head_start = k + 1
            elif ch == "{":
                head = code[head_start:k]
                stripped = head.strip()
                if re.search(r"\b(namespace|extern)\b", stripped) and "(" not in stripped:
                    close = matching_brace(code, k)
                    scan(k + 1, close)
                    k, head_start = close + 1, close + 1
                    continue
                if re.match(r"^(template\s*<.*>\s*)?(class|struct|union)\b", stripped, re.S) and not top_level_outside_parens(
                        stripped, r"="):
                    close = matching_brace(code, k)
                    scan(k + 1, close)
                    k, head_start = close + 1, close + 1
                    continue
                ctor_init = re.search(r"\)\s*(?:noexcept\s*)?:(?!:)", stripped)
                body = k
                if ctor_init and not top_level_outside_parens(stripped[:ctor_init.start()], r"[^=!<>]=[^=]"):
                    colon = head_start + (len(head) - len(head.lstrip())) + ctor_init.end() - 1
                    body = skip_initializer_list(code, colon + 1) or k
                is_function = (
                    "(" in stripped
                    and not top_level_outside_parens(stripped, r"(?<!operator)(?<![=!<>])=(?!=)")
                    and function_name(stripped) is not None
                    and function_name(stripped).split("::")[-1] not in CONTROL
                    and re.search(r"\)\s*(const|noexcept|override|final|mutable|volatile|&|&&|->[^{]*|\s)*$",
                                  code[head_start:body] if body != k else stripped) is not None
                )
                close = matching_brace(code, body)
                if is_function:
                    first = head_start + (len(head) - len(head.lstrip()))
                    name = function_name(code[head_start:body]) or "?"
                    found.append((name, line_of[first], line_of[close]))
                k, head_start = close + 1, close + 1
                continue
            k += 1

    scan(0, len(code))
    return found


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max", type=int, default=120, help="longest allowed function, in lines (default 120)")
    parser.add_argument("--all", action="store_true", help="list every function with its length")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    rows = []
    for path in args.files:
        with open(path, encoding="utf-8") as f:
            code = blank_comments_and_literals(f.read())
        for name, first, last in functions(code):
            rows.append((last - first + 1, path, first, name))
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    over = [r for r in rows if r[0] > args.max]
    for length, path, first, name in rows if args.all else over:
        print(f"{length:5d}  {path}:{first}  {name}")
    if not args.all:
        print(f"{len(over)} function(s) over {args.max} lines in {len(args.files)} file(s)", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
