# agentbox's code interpreter kernel: one long-lived Python process in a sandbox, driven over its
# terminal by agentbox (internal/interp). Each request is one JSON line in; the replies are JSON
# lines out, {"id": n, "ev": {...}} for each event and {"id": n, "done": true} at the end. The
# events have the shape E2B's code interpreter streams: stdout, stderr, result (a MIME bundle),
# error (name, value, traceback) and number_of_executions. Contexts are separate namespaces.
import ast, base64, json, os, sys, threading, time, traceback, tty, uuid

_proto = os.fdopen(os.dup(1), "w", buffering=1)
_lock = threading.Lock()
_current = [None]  # the id of the request whose output fd 1 and 2 carry


def send(obj):
    line = json.dumps(obj, separators=(",", ":"))
    with _lock:
        _proto.write(line + "\n")
        _proto.flush()


def emit(ev):
    rid = _current[0]
    if rid is not None:
        send({"id": rid, "ev": ev})


def now_us():
    return int(time.time() * 1e6)


class Stream:
    # Line-buffered: each event is whole lines (what is left is sent at flush, and at the end
    # of the cell).
    def __init__(self, name):
        self.name = name
        self.buf = ""

    def write(self, s):
        if not isinstance(s, str):
            s = str(s)
        self.buf += s
        i = self.buf.rfind("\n")
        if i >= 0:
            out, self.buf = self.buf[: i + 1], self.buf[i + 1 :]
            emit({"type": self.name, "text": out, "timestamp": now_us()})
        return len(s)

    def flush(self):
        if self.buf:
            out, self.buf = self.buf, ""
            emit({"type": self.name, "text": out, "timestamp": now_us()})

    def isatty(self):
        return False

    def fileno(self):
        return 1 if self.name == "stdout" else 2

    @property
    def encoding(self):
        return "utf-8"


def pump(fd, name):
    # What processes the code starts write to fd 1 and 2 (the pipes behind them).
    while True:
        try:
            b = os.read(fd, 65536)
        except OSError:
            return
        if not b:
            return
        emit({"type": name, "text": b.decode("utf-8", "replace"), "timestamp": now_us()})


def redirect(fd, name):
    r, w = os.pipe()
    os.dup2(w, fd)
    os.close(w)
    threading.Thread(target=pump, args=(r, name), daemon=True).start()


MIME = {
    "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg", "image/png": "png",
    "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
    "application/javascript": "javascript",
}
REPR = {"_repr_html_": "html", "_repr_markdown_": "markdown", "_repr_svg_": "svg", "_repr_png_": "png",
        "_repr_jpeg_": "jpeg", "_repr_latex_": "latex", "_repr_json_": "json", "_repr_javascript_": "javascript"}


def bundle(value, main):
    out = {"type": "result", "is_main_result": main, "text": repr(value)}
    mb = getattr(value, "_repr_mimebundle_", None)
    if callable(mb):
        try:
            data = mb()
            if isinstance(data, tuple):
                data = data[0]
            for mime, key in MIME.items():
                if mime in (data or {}):
                    out[key] = data[mime]
            if "text/plain" in (data or {}):
                out["text"] = data["text/plain"]
        except Exception:
            pass
    for meth, key in REPR.items():
        f = getattr(value, meth, None)
        if callable(f) and key not in out:
            try:
                v = f()
            except Exception:
                continue
            if v is None:
                continue
            if isinstance(v, tuple):
                v = v[0]
            if isinstance(v, bytes):
                v = base64.b64encode(v).decode()
            out[key] = v
    # A matplotlib figure shows as a PNG.
    if type(value).__module__.startswith("matplotlib") and "png" not in out:
        fig = getattr(value, "figure", None) or value
        if hasattr(fig, "savefig"):
            import io
            buf = io.BytesIO()
            fig.savefig(buf, format="png")
            out["png"] = base64.b64encode(buf.getvalue()).decode()
    return out


class Context:
    def __init__(self, cid, language, cwd):
        self.id, self.language, self.cwd = cid, language, cwd
        self.ns = {"__name__": "__main__", "__builtins__": __builtins__}

    def info(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}


contexts = {}
executions = [0]


def display(*objs):
    for o in objs:
        emit(bundle(o, False))


def execute(ctx, code, env):
    saved = {}
    for k, v in (env or {}).items():
        saved[k] = os.environ.get(k)
        os.environ[k] = v
    try:
        if ctx.cwd:
            os.chdir(ctx.cwd)
    except OSError:
        pass
    executions[0] += 1
    emit({"type": "number_of_executions", "execution_count": executions[0]})
    ctx.ns.setdefault("display", display)
    try:
        tree = ast.parse(code, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), ctx.ns)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), ctx.ns)
            if value is not None:
                ctx.ns["_"] = value
                emit(bundle(value, True))
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: the kernel stays
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        # Drop the kernel's own frame: the traceback starts at the cell.
        tb = [tb[0]] + [l for l in tb[1:] if 'File "<string>"' not in l] if tb else tb
        emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": "".join(tb)})
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def handle(req):
    op = req.get("op")
    if op == "execute":
        cid = req.get("context_id") or "default"
        ctx = contexts.get(cid)
        if ctx is None:
            if cid != "default":
                return {"error": "context %s not found" % cid, "status": 404}
            ctx = contexts["default"] = Context("default", "python", req.get("cwd") or os.getcwd())
        execute(ctx, req.get("code", ""), req.get("env_vars"))
        time.sleep(0.002)  # what the pipes still hold
        return {}
    if op == "create_context":
        c = Context(str(uuid.uuid4()), req.get("language") or "python", req.get("cwd") or os.getcwd())
        contexts[c.id] = c
        return {"context": c.info()}
    if op == "list_contexts":
        return {"contexts": [c.info() for c in contexts.values()]}
    if op in ("remove_context", "restart_context"):
        c = contexts.get(req.get("context_id"))
        if c is None:
            return {"error": "context %s not found" % req.get("context_id"), "status": 404}
        if op == "remove_context":
            del contexts[c.id]
        else:
            contexts[c.id] = Context(c.id, c.language, c.cwd)
        return {}
    return {"error": "unknown op %r" % op, "status": 400}


def main():
    tty.setraw(0)
    fd0 = os.open(os.devnull, os.O_RDONLY)
    stdin = os.fdopen(os.dup(0), "rb", buffering=0)
    os.dup2(fd0, 0)
    redirect(1, "stdout")
    redirect(2, "stderr")
    sys.stdout, sys.stderr = Stream("stdout"), Stream("stderr")
    sys.stdin = open(os.devnull)
    send({"ready": True, "pid": os.getpid()})
    buf = b""
    while True:
        chunk = stdin.read(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not line.strip():
                continue
            try:
                req = json.loads(base64.b64decode(line))
            except Exception as e:
                send({"id": None, "error": "bad request: %s" % e})
                continue
            _current[0] = req.get("id")
            try:
                reply = handle(req)
            except Exception as e:
                reply = {"error": repr(e), "status": 500}
            reply["id"], reply["done"] = req.get("id"), True
            send(reply)
            _current[0] = None


main()
