# agentbox run_python driver (constant; written into the sandbox beside the snippet).
# argv: CODE_PATH RESULT_PATH. Runs the snippet in a fresh namespace like a notebook cell: the
# last statement, when it is an expression, is evaluated and its repr (and, for simple JSON
# values, the value) reported. The structured result goes to RESULT_PATH as JSON, never to the
# program's stdout.
import sys

# Like a notebook: the working directory, not the driver's, is first on the module path.
sys.path[0] = ""
import ast, json, linecache, os, traceback

MAX_REPR = 65536
MAX_TB = 65536
MAX_JSON = 65536
FILENAME = "<snippet>"


def bounded(s, n):
    if len(s) > n:
        return s[:n] + "\n[agentbox: %d more characters cut]" % (len(s) - n), True
    return s, False


def main(code_path):
    res = {"ok": True}
    try:
        os.makedirs("/workspace/out", exist_ok=True)
    except OSError:
        pass
    with open(code_path, encoding="utf-8", errors="replace") as f:
        src = f.read()
    linecache.cache[FILENAME] = (len(src), None, src.splitlines(True), FILENAME)
    ns = {"__name__": "__main__", "__builtins__": __builtins__, "__file__": FILENAME}
    sys.argv = [FILENAME]
    try:
        try:
            tree = ast.parse(src, filename=FILENAME, mode="exec")
        except SyntaxError as e:
            tb = "".join(traceback.format_exception_only(type(e), e))
            res["exception"] = {"type": "SyntaxError", "message": str(e), "traceback": bounded(tb, MAX_TB)[0]}
            return res
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        try:
            exec(compile(tree, FILENAME, "exec"), ns)
            v = None
            if last is not None:
                v = eval(compile(last, FILENAME, "eval"), ns)
        except SystemExit as e:
            if e.code in (None, 0):
                return res
            res["exception"] = {"type": "SystemExit", "message": str(e.code), "traceback": ""}
            return res
        except BaseException as e:
            # Drop the driver's own frame: the traceback starts in the snippet.
            tbo = e.__traceback__.tb_next if e.__traceback__ is not None else None
            tb = "".join(traceback.format_exception(type(e), e, tbo))
            res["exception"] = {"type": type(e).__name__, "message": str(e), "traceback": bounded(tb, MAX_TB)[0]}
            return res
        if last is not None and v is not None:
            try:
                r = repr(v)
            except BaseException as e:
                r = "<repr failed: %s: %s>" % (type(e).__name__, e)
            r, cut = bounded(r, MAX_REPR)
            val = {"repr": r, "type": type(v).__name__, "repr_truncated": cut}
            if isinstance(v, (bool, int, float, str, list, tuple, dict)):
                try:
                    s = json.dumps(v, allow_nan=False)
                    if len(s) <= MAX_JSON:
                        val["json"] = json.loads(s)
                except (TypeError, ValueError, RecursionError, OverflowError):
                    pass
            res["value"] = val
        return res
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass


def write(res, path):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(res, f, ensure_ascii=True)
    os.replace(tmp, path)


if __name__ == "__main__":
    _code, _result = sys.argv[1], sys.argv[2]
    write(main(_code), _result)
