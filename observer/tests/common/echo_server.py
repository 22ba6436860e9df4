import socket, struct, sys, threading, time
host, port = sys.argv[1], int(sys.argv[2])
idle_timeout = float(sys.argv[3]) if len(sys.argv) > 3 else None
delay = float(sys.argv[4]) if len(sys.argv) > 4 else 0
fam = socket.AF_INET6 if ":" in host else socket.AF_INET
s = socket.socket(fam)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, port))
s.listen(128)
print("ready", flush=True)
def serve(c):
    c.settimeout(idle_timeout)
    while True:
        try:
            d = c.recv(65536)
        except OSError:
            break
        if not d:
            break
        if d == b"reset":
            # A stray reset: abort this one connection (SO_LINGER 0).
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            break
        if delay:
            time.sleep(delay)
        c.sendall(d)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
