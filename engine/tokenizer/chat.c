/*
 * chat.c - chat templates through jinja2 in an embedded CPython (chat.h).
 *
 * Why Python: a chat template is a Jinja program, and the one
 * implementation every checkpoint's template is written and tested
 * against is jinja2 as transformers drives it; a C subset would render
 * some templates differently. The interpreter starts once, isolated (no
 * environment variables, no user site, no signal handlers: the engine
 * owns its signals), and runs the glue below as the module hypic_chat.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "engine/tokenizer/chat.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The glue: what transformers' apply_chat_template sets up around
 * jinja2 (see chat.h), and the OpenAI request turned into its inputs. */
static const char GLUE[] =
    "import datetime, json, os\n"
    "import jinja2, jinja2.ext, jinja2.nodes, jinja2.utils\n"
    "from jinja2.sandbox import ImmutableSandboxedEnvironment\n"
    "\n"
    "CHATML = ('{%- for message in messages %}'\n"
    "          '{{- \"<|im_start|>\" + message.role + \"\\n\" }}'\n"
    "          '{%- if message.content is string %}{{- message.content }}'\n"
    "          '{%- endif %}{{- \"<|im_end|>\\n\" }}{%- endfor %}'\n"
    "          '{%- if add_generation_prompt %}'\n"
    "          '{{- \"<|im_start|>assistant\\n\" }}{%- endif %}')\n"
    "NAMED = ('bos_token', 'eos_token', 'unk_token', 'sep_token',\n"
    "         'pad_token', 'cls_token', 'mask_token')\n"
    "REASONING = ('reasoning_content', 'thinking', 'reasoning')\n"
    "\n"
    "class Generation(jinja2.ext.Extension):\n"
    "    # {% generation %} marks assistant text for training masks;\n"
    "    # rendering keeps its body as it is\n"
    "    tags = {'generation'}\n"
    "    def parse(self, parser):\n"
    "        line = next(parser.stream).lineno\n"
    "        body = parser.parse_statements(['name:endgeneration'],\n"
    "                                       drop_needle=True)\n"
    "        call = self.call_method('_body')\n"
    "        return jinja2.nodes.CallBlock(call, [], [], body)"
    ".set_lineno(line)\n"
    "    def _body(self, caller):\n"
    "        return caller()\n"
    "\n"
    "def raise_exception(message):\n"
    "    raise jinja2.exceptions.TemplateError(message)\n"
    "\n"
    "def tojson(x, ensure_ascii=False, indent=None, separators=None,\n"
    "           sort_keys=False):\n"
    "    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,\n"
    "                      separators=separators, sort_keys=sort_keys)\n"
    "\n"
    "def strftime_now(fmt):\n"
    "    return datetime.datetime.now().strftime(fmt)\n"
    "\n"
    "class Dict:\n"
    "    # dict() without the class itself in reach of the template\n"
    "    def __call__(self, *args, **kwargs):\n"
    "        return dict(*args, **kwargs)\n"
    "    def fromkeys(self, *args, **kwargs):\n"
    "        return dict.fromkeys(*args, **kwargs)\n"
    "\n"
    "class Namespace(jinja2.utils.Namespace):\n"
    "    # no underscore names: they lead to the interpreter's internals\n"
    "    def __init__(*args, **kwargs):\n"
    "        self, args = args[0], args[1:]\n"
    "        attrs = dict(*args, **kwargs)\n"
    "        for name in attrs:\n"
    "            Namespace.check(name)\n"
    "        jinja2.utils.Namespace.__init__(self, attrs)\n"
    "    def __setitem__(self, name, value):\n"
    "        Namespace.check(name)\n"
    "        jinja2.utils.Namespace.__setitem__(self, name, value)\n"
    "    @staticmethod\n"
    "    def check(name):\n"
    "        if isinstance(name, str) and name.startswith('_'):\n"
    "            raise jinja2.exceptions.SecurityError(\n"
    "                'a namespace attribute may not start with _: %r'"
    " % name)\n"
    "\n"
    "def compile_template(source):\n"
    "    env = ImmutableSandboxedEnvironment(\n"
    "        trim_blocks=True, lstrip_blocks=True,\n"
    "        extensions=[Generation, jinja2.ext.loopcontrols])\n"
    "    env.filters['tojson'] = tojson\n"
    "    env.globals['raise_exception'] = raise_exception\n"
    "    env.globals['strftime_now'] = strftime_now\n"
    "    env.globals['dict'] = Dict()\n"
    "    env.globals['namespace'] = Namespace\n"
    "    return env.from_string(source)\n"
    "\n"
    "class Compiled:\n"
    "    # as transformers: a template that does not compile fails the\n"
    "    # requests that use it, not the loading of the model\n"
    "    def __init__(self, source):\n"
    "        try:\n"
    "            self.template, self.why = compile_template(source), None\n"
    "        except jinja2.exceptions.TemplateSyntaxError as e:\n"
    "            self.template = None\n"
    "            self.why = 'line %d: %s' % (e.lineno, e.message)\n"
    "    def render(self, **kwargs):\n"
    "        if self.template is None:\n"
    "            raise jinja2.exceptions.TemplateError(\n"
    "                'the template does not compile: ' + self.why)\n"
    "        return self.template.render(**kwargs)\n"
    "\n"
    "def token_text(value):\n"
    "    if isinstance(value, dict):\n"
    "        value = value.get('content')\n"
    "    return value if isinstance(value, str) else None\n"
    "\n"
    "class Chat:\n"
    "    def __init__(self, path):\n"
    "        config = {}\n"
    "        name = os.path.join(path, 'tokenizer_config.json')\n"
    "        if os.path.exists(name):\n"
    "            with open(name, encoding='utf-8') as f:\n"
    "                config = json.load(f)\n"
    "        source = config.get('chat_template')\n"
    "        self.origin = 'tokenizer_config.json'\n"
    "        name = os.path.join(path, 'chat_template.jinja')\n"
    "        if os.path.exists(name):\n"
    "            with open(name, encoding='utf-8') as f:\n"
    "                source = f.read()\n"
    "            self.origin = 'chat_template.jinja'\n"
    "        if isinstance(source, list):\n"
    "            source = {t['name']: t['template'] for t in source}\n"
    "        if not source:\n"
    "            source = CHATML\n"
    "            self.origin = 'ChatML (the model has none)'\n"
    "        if isinstance(source, str):\n"
    "            source = {'default': source}\n"
    "        self.templates = {k: Compiled(v) for k, v in source.items()}\n"
    "        self.tool_xml = any('<function=' in v for v in source.values())\n"
    "        # the special tokens transformers hands every template\n"
    "        self.specials = {}\n"
    "        for key, value in config.items():\n"
    "            text = token_text(value)\n"
    "            if text is not None and (key in NAMED or\n"
    "                                     key.endswith('_token')):\n"
    "                self.specials[key] = text\n"
    "        extra = config.get('extra_special_tokens')\n"
    "        if isinstance(extra, dict):\n"
    "            for key, value in extra.items():\n"
    "                if token_text(value) is not None:\n"
    "                    self.specials[key] = token_text(value)\n"
    "\n"
    "    def pick(self, tools):\n"
    "        if tools is not None and 'tool_use' in self.templates:\n"
    "            return self.templates['tool_use']\n"
    "        if 'default' not in self.templates:\n"
    "            raise jinja2.exceptions.TemplateError(\n"
    "                'the model has several chat templates and no default')\n"
    "        return self.templates['default']\n"
    "\n"
    "    def render(self, body):\n"
    "        try:\n"
    "            req = json.loads(body)\n"
    "            tools = tools_of(req)\n"
    "            kwargs = dict(self.specials)\n"
    "            kwargs.update(req.get('chat_template_kwargs') or {})\n"
    "            text = self.pick(tools).render(\n"
    "                messages=[message_of(m) for m in req['messages']],\n"
    "                tools=tools, documents=None,\n"
    "                add_generation_prompt=True, **kwargs)\n"
    "            return (True, text)\n"
    "        except jinja2.exceptions.TemplateError as e:\n"
    "            return (False, str(e))\n"
    "        except Exception as e:\n"
    "            return (False, '%s: %s' % (type(e).__name__, e))\n"
    "\n"
    "def tools_of(req):\n"
    "    tools = req.get('tools') or None\n"
    "    choice = req.get('tool_choice')\n"
    "    if tools is not None and isinstance(choice, dict):\n"
    "        name = choice['function']['name']\n"
    "        tools = [t for t in tools if t['function']['name'] == name]\n"
    "    return tools\n"
    "\n"
    "def message_of(m):\n"
    "    # an OpenAI message as transformers users write one\n"
    "    m = {k: v for k, v in m.items() if v is not None}\n"
    "    if m.get('role') == 'developer':\n"
    "        m['role'] = 'system'\n"
    "    if isinstance(m.get('content'), list):\n"
    "        m['content'] = ''.join(p['text'] for p in m['content'])\n"
    "    calls = []\n"
    "    for call in m.get('tool_calls') or []:\n"
    "        call = dict(call)\n"
    "        fn = dict(call.get('function') or {})\n"
    "        if isinstance(fn.get('arguments'), str):\n"
    "            fn['arguments'] = json.loads(fn['arguments'])\n"
    "        call['function'] = fn\n"
    "        calls.append(call)\n"
    "    if calls:\n"
    "        m['tool_calls'] = calls\n"
    "    said = next((m[k] for k in REASONING if m.get(k) is not None),\n"
    "                None)\n"
    "    if said is not None:\n"
    "        m = {'thinking': said, **m, 'reasoning_content': said}\n"
    "    return m\n";

/* Under LeakSanitizer: the interpreter is never finalized (a process
 * renders until it exits), so what it holds at exit is not a leak. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libpython3\nleak:libcrypto.so\n"; /* its hashlib */
}

struct hp_chat {
    PyObject *chat; /* a hypic_chat.Chat */
    char origin[64];
    int tool_xml; /* hp_chat_tool_xml */
};

static pthread_once_t py_once = PTHREAD_ONCE_INIT;
static PyObject *py_glue;     /* the module, NULL if it failed */
static char py_why[512] = ""; /* why it failed */

/* The pending exception as one line into err (and cleared). */
static int py_error(hp_error_t *err, int code, const char *what)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *s = value ? PyObject_Str(value) : NULL;
    const char *msg = s ? PyUnicode_AsUTF8(s) : NULL;
    const char *name = type ? ((PyTypeObject *)type)->tp_name : "unknown error";
    hp_error_set(err, code, "%s: %s: %s", what, name, msg ? msg : "");
    PyErr_Clear();
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return code;
}

static void py_start(void)
{
    PyConfig cfg;
    PyConfig_InitIsolatedConfig(&cfg);
    cfg.install_signal_handlers = 0;
    cfg.site_import = 1; /* the distribution's packages: jinja2 */
    PyStatus st = Py_InitializeFromConfig(&cfg);
    PyConfig_Clear(&cfg);
    if (PyStatus_Exception(st)) {
        snprintf(py_why, sizeof(py_why), "cannot start Python: %s",
                 st.err_msg ? st.err_msg : "unknown error");
        return;
    }
    PyObject *code = Py_CompileString(GLUE, "hypic_chat", Py_file_input);
    PyObject *mod = code ? PyImport_ExecCodeModule("hypic_chat", code) : NULL;
    Py_XDECREF(code);
    if (!mod) {
        hp_error_t e;
        py_error(&e, HP_EUNAVAIL, "chat templates need Python's jinja2");
        snprintf(py_why, sizeof(py_why), "%s", e.msg);
    }
    py_glue = mod;
    /* other threads render: the lock is taken per call */
    PyEval_SaveThread();
}

int hp_chat_load(hp_chat_t **out, const char *dir, hp_error_t *err)
{
    *out = NULL;
    pthread_once(&py_once, py_start);
    if (!py_glue)
        return hp_error_set(err, HP_EUNAVAIL, "%s", py_why);
    hp_chat_t *c = calloc(1, sizeof(*c));
    if (!c)
        return hp_error_set(err, HP_ENOMEM, "chat template: out of memory");
    int rc = HP_OK;
    PyGILState_STATE g = PyGILState_Ensure();
    c->chat = PyObject_CallMethod(py_glue, "Chat", "s", dir);
    if (!c->chat) {
        rc = py_error(err, HP_EMODEL, "the chat template of the model");
    } else {
        PyObject *o = PyObject_GetAttrString(c->chat, "origin");
        const char *s = o ? PyUnicode_AsUTF8(o) : NULL;
        snprintf(c->origin, sizeof(c->origin), "%s", s ? s : "?");
        Py_XDECREF(o);
        o = PyObject_GetAttrString(c->chat, "tool_xml");
        c->tool_xml = o && PyObject_IsTrue(o) == 1;
        Py_XDECREF(o);
        PyErr_Clear();
    }
    PyGILState_Release(g);
    if (rc != HP_OK) {
        free(c);
        return rc;
    }
    *out = c;
    return HP_OK;
}

const char *hp_chat_origin(const hp_chat_t *c)
{
    return c->origin;
}

int hp_chat_tool_xml(const hp_chat_t *c)
{
    return c->tool_xml;
}

int hp_chat_render(hp_chat_t *c, const char *body, size_t len, char **out,
                   size_t *out_len, hp_error_t *err)
{
    int rc = HP_OK;
    *out = NULL;
    *out_len = 0;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r =
        PyObject_CallMethod(c->chat, "render", "s#", body, (Py_ssize_t)len);
    PyObject *ok = r && PyTuple_Check(r) && PyTuple_Size(r) == 2
                       ? PyTuple_GetItem(r, 0)
                       : NULL;
    PyObject *text = ok ? PyTuple_GetItem(r, 1) : NULL;
    Py_ssize_t n = 0;
    const char *s = text ? PyUnicode_AsUTF8AndSize(text, &n) : NULL;
    if (!s) {
        rc = py_error(err, HP_EINTERNAL, "chat template");
    } else if (!PyObject_IsTrue(ok)) {
        rc = hp_error_set(err, HP_EBADINPUT, "chat template: %s", s);
    } else if (!(*out = malloc((size_t)n + 1))) {
        rc = hp_error_set(err, HP_ENOMEM, "chat template: out of memory");
    } else {
        memcpy(*out, s, (size_t)n);
        (*out)[n] = '\0';
        *out_len = (size_t)n;
    }
    Py_XDECREF(r);
    PyGILState_Release(g);
    return rc;
}

void hp_chat_free(hp_chat_t *c)
{
    if (!c)
        return;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(c->chat);
    PyGILState_Release(g);
    free(c);
}
