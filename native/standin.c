/* The native stand-in: the kernelspec's first word where a wheel shipped it (issue 36, item 2).

     kb-standin VENV CONFIG FALLBACK...

   FALLBACK is the kernelspec's argv without us (bootstrap.env.kernelspec.lean_argv), and ends
   with `run --config CONFIG -- PYTHON-ARGS`. We ask the venv's kernel server for a kernel for
   PYTHON-ARGS, as bootstrap/kernels/client.py does, with `"warm": true`: the server checks the
   warm fingerprint for us (bootstrap/kernels/gate.py), the one check we skip. Once it has forked
   the kernel we are its stand-in, as bootstrap/kernels/standin.py is: signals relayed to the
   kernel's process group while its pidfd says it lives, ipykernel's parent poller played, and
   our exit the kernel's. Anything else (no server, a refusal, any doubt) execs FALLBACK, which
   does all of it the Python way: no decision is ever ours alone. Before we ask, we bind the
   ports the connection file names and send the listening sockets along ("bound"): the kernel
   adopts them, and no other process can take a port in the meantime. The protocol is
   bootstrap/kernels/protocol.py's; docs/architecture.md says why a native stand-in. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

extern char **environ;

#define MAX_NAME 200             /* bootstrap/kernels/places.py: longer means no server */
#define CONNECT_TIMEOUT_MS 2000  /* client.py: connect, send, and the first answer */
#define FORK_TIMEOUT_MS 120000   /* client.py: queued -> forked */
#define POLL_MS 1000             /* standin.py: the launcher's presence, as ipykernel checks */
#define MAX_MESSAGE (4 << 20)    /* protocol.py */
#define N_BOUND 5                /* protocol.py: a kernel's ports */
#define BACKLOG 100              /* libzmq's default ZMQ_BACKLOG, which its own bind would use */
#define MAX_CONNECTION_FILE 65536

static char **fallback;
static pid_t kernel = -1;
static int pidfd = -1;
static int bound_fd[N_BOUND];
static long bound_port[N_BOUND];
static int n_bound;

static void release_bound(void);

static void run_fallback(void) {
    release_bound();
    execv(fallback[0], fallback);
    dprintf(2, "kernel-bootstrap: error: cannot start %s: %s\n", fallback[0], strerror(errno));
    _exit(127);
}

/* -- the request: JSON as protocol.encode writes it (ASCII, \u escapes; bytes that are not
   UTF-8 as Python's surrogateescape reads them, \udcXX) ------------------------------------ */

struct buf { char *data; size_t len, cap; };

static void put(struct buf *b, const char *s, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = (b->len + n) * 2 + 256;
        char *data = realloc(b->data, cap);
        if (data == NULL) run_fallback();
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    if (b->len > MAX_MESSAGE) run_fallback();
}

static void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

static void put_u(struct buf *b, unsigned u) {
    char esc[8];
    snprintf(esc, sizeof esc, "\\u%04x", u);
    put(b, esc, 6);
}

/* The length of the UTF-8 sequence at s (its code point in *cp), or 0 when it is not one. */
static int utf8(const unsigned char *s, size_t n, unsigned *cp) {
    unsigned c = s[0];
    int len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
    if (len == 0 || c >= 0xf5 || (size_t)len > n) return 0;
    unsigned v = c & (0x3f >> (len - 1));
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    static const unsigned least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < least[len] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return len;
}

static void put_string(struct buf *b, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    put(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned c = p[i], cp;
        if (c < 0x80) {
            if (c == '"' || c == '\\') { char e[2] = {'\\', (char)c}; put(b, e, 2); }
            else if (c == '\n') puts_(b, "\\n");
            else if (c == '\r') puts_(b, "\\r");
            else if (c == '\t') puts_(b, "\\t");
            else if (c == '\b') puts_(b, "\\b");
            else if (c == '\f') puts_(b, "\\f");
            else if (c < 0x20 || c == 0x7f) put_u(b, c);
            else put(b, (const char *)p + i, 1);
            i++;
            continue;
        }
        int len = utf8(p + i, n - i, &cp);
        if (len == 0) {  /* surrogateescape */
            put_u(b, 0xdc00 + c);
            i++;
            continue;
        }
        if (cp >= 0x10000) {
            cp -= 0x10000;
            put_u(b, 0xd800 + (cp >> 10));
            put_u(b, 0xdc00 + (cp & 0x3ff));
        } else {
            put_u(b, cp);
        }
        i += (size_t)len;
    }
    put(b, "\"", 1);
}

static void put_key(struct buf *b, const char *key) {
    put_string(b, key, strlen(key));
    put(b, ":", 1);
}

static void put_env(struct buf *b) {
    put(b, "{", 1);
    int first = 1;
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        if (eq == NULL || eq == *e) continue;  /* as os.environ, which skips them */
        size_t klen = (size_t)(eq - *e);
        int seen = 0;  /* os.environ keeps a name's first value */
        for (char **f = environ; f < e && !seen; f++)
            seen = strncmp(*f, *e, klen + 1) == 0;
        if (seen) continue;
        if (!first) put(b, ",", 1);
        first = 0;
        put_string(b, *e, klen);
        put(b, ":", 1);
        put_string(b, eq + 1, strlen(eq + 1));
    }
    put(b, "}", 1);
}

static void build_request(struct buf *b, char **python_args, const char *venv,
                          const char *config) {
    char cwd[PATH_MAX], generation[PATH_MAX], num[32];
    if (getcwd(cwd, sizeof cwd) == NULL || realpath(venv, generation) == NULL) run_fallback();
    int securebits = prctl(PR_GET_SECUREBITS);
    if (securebits < 0) run_fallback();
    puts_(b, "{\"kind\":\"kernel\",\"argv\":[");
    for (char **a = python_args; *a; a++) {
        if (a != python_args) put(b, ",", 1);
        put_string(b, *a, strlen(*a));
    }
    puts_(b, "],");
    put_key(b, "cwd"); put_string(b, cwd, strlen(cwd)); put(b, ",", 1);
    put_key(b, "env"); put_env(b); put(b, ",", 1);
    put_key(b, "venv"); put_string(b, venv, strlen(venv)); put(b, ",", 1);
    put_key(b, "generation"); put_string(b, generation, strlen(generation)); put(b, ",", 1);
    put_key(b, "config"); put_string(b, config, strlen(config)); put(b, ",", 1);
    snprintf(num, sizeof num, "%d", securebits);
    puts_(b, "\"securebits\":"); puts_(b, num);
    puts_(b, ",\"bound\":[");
    for (int i = 0; i < n_bound; i++) {
        snprintf(num, sizeof num, i ? ",%ld" : "%ld", bound_port[i]);
        puts_(b, num);
    }
    puts_(b, "],\"warm\":true}\n");
}

/* -- where the server is: bootstrap/kernels/places.py, checked as it checks ------------------ */

static int opened(int dirfd, const char *name, int private_) {
    int fd = openat(dirfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return -1;
    if (fstat(fd, &st) < 0 || !S_ISDIR(st.st_mode)) goto refused;
    if (private_) {
        if (st.st_uid != geteuid() || (st.st_mode & 077)) goto refused;
    } else if ((st.st_uid != geteuid() && st.st_uid != 0) || (st.st_mode & 022)) {
        goto refused;  /* bootstrap.warm.untrusted */
    }
    return fd;
refused:
    close(fd);
    return -1;
}

/* The server directory's descriptor, or -1: cache root (bootstrap.warm.cache_dir), kernels/,
   then the venv's escaped name. */
static int server_dir(const char *venv) {
    char root[PATH_MAX], name[MAX_NAME * 3 + 1];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg != NULL && xdg[0] == '/')
        n = snprintf(root, sizeof root, "%s/kernel-bootstrap", xdg);
    else if (home != NULL && home[0] != '\0')
        n = snprintf(root, sizeof root, "%s/.cache/kernel-bootstrap", home);
    else
        return -1;  /* Python's expanduser asks the password database: the fallback does */
    if (n < 0 || (size_t)n >= sizeof root || venv[0] != '/') return -1;
    size_t len = 0;
    for (const char *p = venv; *p; p++) {
        const char *part = *p == '%' ? "%25" : *p == '/' ? "%2F" : NULL;
        size_t plen = part ? 3 : 1;
        if (len + plen > MAX_NAME) return -1;
        memcpy(name + len, part ? part : p, plen);
        len += plen;
    }
    name[len] = '\0';
    int top = opened(AT_FDCWD, root, 0);
    if (top < 0) return -1;
    int kernels = opened(top, "kernels", 0);
    close(top);
    if (kernels < 0) return -1;
    int dir = opened(kernels, name, 1);
    close(kernels);
    return dir;
}

/* -- asking ------------------------------------------------------------------------------- */

static char line[65536];
static size_t line_len;
static char readbuf[65536];
static size_t read_pos, read_end;

/* The next line from the server (NUL-terminated in `line`): 1; 0 at EOF or on an error; -1
   after `timeout_ms` (-1: none) without one. */
static int next_line(int sock, int timeout_ms) {
    line_len = 0;
    for (;;) {
        while (read_pos < read_end) {
            char c = readbuf[read_pos++];
            if (c == '\n') { line[line_len] = '\0'; return 1; }
            if (line_len < sizeof line - 1) line[line_len++] = c;
        }
        struct pollfd p = {.fd = sock, .events = POLLIN};
        int ready = poll(&p, 1, timeout_ms);
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0) return -1;
        if (ready < 0) return 0;
        ssize_t got = read(sock, readbuf, sizeof readbuf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return 0;
        read_pos = 0;
        read_end = (size_t)got;
    }
}

static const char *skip_space(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

/* Where the value of "key" starts in the JSON object `text`, or NULL without one. */
static const char *value_of(const char *text, const char *key) {
    char pattern[32];
    snprintf(pattern, sizeof pattern, "\"%s\"", key);
    for (const char *at = strstr(text, pattern); at; at = strstr(at + 1, pattern)) {
        const char *p = skip_space(at + strlen(pattern));
        if (*p == ':') return skip_space(p + 1);
    }
    return NULL;
}

/* The non-negative integer value of "key" in `text`, or -1 without one. */
static long number(const char *text, const char *key) {
    const char *at = value_of(text, key);
    if (at == NULL || *at < '0' || *at > '9') return -1;
    char *end;
    errno = 0;
    long value = strtol(at, &end, 10);
    return errno ? -1 : value;
}

/* The integer value of "key" in a message of the server's ({"pid":12}), or -1 without one. */
static long field(const char *key) { return number(line, key); }

/* -- the kernel's ports, held from our start: the connection file's, bound as libzmq binds ---- */

/* The connection file among PYTHON-ARGS (ipykernel's -f; the last one wins, as traitlets
   reads it), or NULL. */
static const char *connection_file(char **python_args) {
    const char *file = NULL;
    for (char **a = python_args; *a; a++) {
        if (strcmp(*a, "-f") == 0 && a[1]) file = *++a;
        else if (strncmp(*a, "-f=", 3) == 0) file = *a + 3;
        else if (strncmp(*a, "--f=", 4) == 0) file = *a + 4;
    }
    return file;
}

/* The string value of "key" in `text` (no escapes, at most `size` - 1 bytes) into `out`. */
static int string_of(const char *text, const char *key, char *out, size_t size) {
    const char *at = value_of(text, key);
    if (at == NULL || *at != '"') return -1;
    const char *end = strchr(++at, '"');
    if (end == NULL || (size_t)(end - at) >= size || memchr(at, '\\', (size_t)(end - at)))
        return -1;
    memcpy(out, at, (size_t)(end - at));
    out[end - at] = '\0';
    return 0;
}

static int listening(const struct in_addr *ip, long port) {
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                               .sin_addr = *ip};
    if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0
                    || bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0
                    || listen(fd, BACKLOG) < 0)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Bind what we can of the kernel's tcp ports on an IPv4 address; a port that fails (taken,
   0 for "any") is left to the kernel, as is every port of a file we cannot read so. */
static void bind_ports(char **python_args) {
    static const char *names[N_BOUND] = {"shell_port", "iopub_port", "stdin_port",
                                         "control_port", "hb_port"};
    static char text[MAX_CONNECTION_FILE];
    const char *path = connection_file(python_args);
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY) : -1;
    struct stat st;
    if (fd < 0) return;
    ssize_t got = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < MAX_CONNECTION_FILE)
        got = read(fd, text, sizeof text - 1);
    close(fd);
    if (got <= 0) return;
    text[got] = '\0';
    char transport[8], host[INET_ADDRSTRLEN];
    struct in_addr ip;
    if (string_of(text, "transport", transport, sizeof transport) < 0
            || strcmp(transport, "tcp") != 0
            || string_of(text, "ip", host, sizeof host) < 0
            || inet_pton(AF_INET, strcmp(host, "*") == 0 ? "0.0.0.0" : host, &ip) != 1)
        return;
    for (int i = 0; i < N_BOUND; i++) {
        long port = number(text, names[i]);
        int sock = port > 0 && port < 65536 ? listening(&ip, port) : -1;
        if (sock < 0) continue;
        bound_fd[n_bound] = sock;
        bound_port[n_bound++] = port;
    }
}

/* The kernel is forked: its copies hold the ports now. */
static void close_bound(void) {
    for (int i = 0; i < n_bound; i++) close(bound_fd[i]);
    n_bound = 0;
}

/* Before the fallback starts the kernel the ordinary way: the copies we sent may never be
   received (a stopped server's backlog holds them, and with them the ports), so the sockets
   stop listening. Still bound, with SO_REUSEADDR as libzmq's binds have it, they do not keep
   the kernel from its ports. */
static void release_bound(void) {
    for (int i = 0; i < n_bound; i++) shutdown(bound_fd[i], SHUT_RDWR);
}

static int connect_server(const char *venv) {
    int dir = server_dir(venv);
    if (dir < 0) return -1;
    struct stat st;
    if (fstatat(dir, "sock", &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISSOCK(st.st_mode)
            || st.st_uid != geteuid()) {
        close(dir);
        return -1;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/sock", dir);
    /* Not blocking to connect: a server whose backlog is full (a stopped one) is none, as the
       Python client finds (EAGAIN). Then sends wait at most as long as the first answer may. */
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct timeval limit = {.tv_sec = CONNECT_TIMEOUT_MS / 1000};
    if (sock >= 0 && (connect(sock, (struct sockaddr *)&addr, sizeof addr) < 0
                      || fcntl(sock, F_SETFL, fcntl(sock, F_GETFL) & ~O_NONBLOCK) < 0
                      || setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit) < 0)) {
        close(sock);
        sock = -1;
    }
    close(dir);
    return sock;
}

static int send_request(int sock, struct buf *b) {
    int fds[3 + N_BOUND] = {0, 1, 2};
    memcpy(fds + 3, bound_fd, sizeof(int) * (size_t)n_bound);
    size_t n = sizeof(int) * (size_t)(3 + n_bound);
    union { char data[CMSG_SPACE(sizeof fds)]; struct cmsghdr aligned; } control;
    memset(&control, 0, sizeof control);
    struct iovec iov = {b->data, b->len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.data,
                         .msg_controllen = CMSG_SPACE(n)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(n);
    memcpy(CMSG_DATA(c), fds, n);
    ssize_t sent = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (sent < 0) return -1;
    while ((size_t)sent < b->len) {
        ssize_t more = send(sock, b->data + sent, b->len - (size_t)sent, MSG_NOSIGNAL);
        if (more < 0 && errno == EINTR) continue;
        if (more < 0) return -1;
        sent += more;
    }
    return 0;
}

/* The forked kernel's pid, or -1: the server answered otherwise, or did not answer. */
static pid_t ask(int sock) {
    int timeout = CONNECT_TIMEOUT_MS;
    for (;;) {
        if (next_line(sock, timeout) != 1) return -1;
        long pid = field("pid");
        if (pid > 0) return (pid_t)pid;
        if (strstr(line, "\"queued\":true") == NULL) return -1;  /* stale, ordinary, error */
        timeout = FORK_TIMEOUT_MS;
    }
}

/* -- being the kernel to our launcher: bootstrap/kernels/standin.py --------------------------- */

static int ended(void) {
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    return pidfd < 0 || poll(&p, 1, 0) != 0;
}

static void forward(int signum) {
    int saved = errno;
    if (!ended()) killpg(kernel, signum);
    errno = saved;
}

static void die_of(int signum) {
    struct rlimit core;
    if (getrlimit(RLIMIT_CORE, &core) == 0) {  /* no core file: the kernel wrote its own */
        core.rlim_cur = 0;
        setrlimit(RLIMIT_CORE, &core);
    }
    signal(signum, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, signum);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    kill(getpid(), signum);
}

static void exit_as(long status) {
    if (status < 0 || status > 0xffff) status = SIGKILL;
    int st = (int)status;
    if (WIFEXITED(st)) _exit(WEXITSTATUS(st));
    int signum = WIFSIGNALED(st) ? WTERMSIG(st) : SIGKILL;
    switch (signum) {  /* their default action stops us or does nothing */
    case SIGSTOP: case SIGTSTP: case SIGTTIN: case SIGTTOU: case SIGCONT: case SIGCHLD:
    case SIGURG: case SIGWINCH:
        break;
    default:
        die_of(signum);
    }
    _exit(128 + signum);
}

/* The pid ipykernel's parent poller would watch: -1 when it would not run, 0 to watch for
   reparenting to init. */
static long launcher(void) {
    const char *handle = getenv("JPY_PARENT_PID");
    if (handle == NULL || *handle == '\0') return -1;
    char *end;
    errno = 0;
    long pid = strtol(handle, &end, 10);
    if (errno || *end != '\0' || pid == 0 || pid == 1) return -1;
    return pid == (long)getppid() ? pid : 0;
}

static void stand_in(int sock) {
    pidfd = (int)syscall(SYS_pidfd_open, kernel, 0);  /* -1: it ended already; the answer says */
    struct sigaction act = {.sa_handler = forward, .sa_flags = SA_RESTART};
    sigemptyset(&act.sa_mask);
    int relayed[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof relayed / sizeof *relayed; i++)
        sigaction(relayed[i], &act, NULL);
    long parent = launcher(), last = -1;
    for (;;) {
        int got = next_line(sock, parent >= 0 ? POLL_MS : -1);
        if (got == 1) {
            long status = field("exit");
            if (status >= 0) exit_as(status);
            if (field("last") >= 0) last = field("last");
            continue;
        }
        if (got < 0) {  /* a quiet second: is our launcher still there? */
            pid_t ppid = getppid();
            if ((parent == 0 && ppid == 1) || (parent > 0 && ppid != parent)) {
                if (pidfd >= 0) syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
                _exit(1);
            }
            continue;
        }
        exit_as(last >= 0 ? (last & 0xff) << 8 : SIGKILL);  /* EOF: the kernel's last word */
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        dprintf(2, "usage: kb-standin VENV CONFIG FALLBACK...\n");
        return 2;
    }
    fallback = argv + 3;
    const char *venv = argv[1], *config = argv[2];
    /* PYTHON-ARGS: after the fallback's `run --config CONFIG --`. */
    char **python_args = NULL;
    for (char **a = fallback; a[0] && a[1] && a[2] && a[3]; a++) {
        if (strcmp(a[0], "run") == 0 && strcmp(a[1], "--config") == 0
                && strcmp(a[2], config) == 0 && strcmp(a[3], "--") == 0) {
            python_args = a + 4;
            break;
        }
    }
    const char *serving = getenv("KERNEL_BOOTSTRAP_KERNEL_SERVER");
    if (python_args == NULL || *python_args == NULL || (serving && strcmp(serving, "0") == 0))
        run_fallback();
    int sock = connect_server(venv);
    if (sock < 0) run_fallback();
    bind_ports(python_args);
    struct buf request = {0};
    build_request(&request, python_args, venv, config);
    if (send_request(sock, &request) < 0) run_fallback();
    free(request.data);
    kernel = ask(sock);
    if (kernel <= 0) {
        close(sock);
        run_fallback();
    }
    close_bound();
    stand_in(sock);
    return 1;
}
