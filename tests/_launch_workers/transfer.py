"""Times sending argv[2] bytes over 127.0.0.1 from this process to a server process it starts.

The server answers one byte once everything arrived, so the time covers the whole transfer.
Prints the seconds taken.
"""

import socket
import subprocess
import sys
import time


def serve(nbytes: int) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        print(server.getsockname()[1], flush=True)
        conn, _ = server.accept()
        with conn:
            received = 0
            while received < nbytes:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    raise SystemExit(f"peer closed after {received} of {nbytes} bytes")
                received += len(chunk)
            conn.sendall(b"k")


def send(nbytes: int) -> None:
    server = subprocess.Popen([sys.executable, __file__, "serve", str(nbytes)], stdout=subprocess.PIPE)
    try:
        port = int(server.stdout.readline())
        payload = b"x" * nbytes
        with socket.create_connection(("127.0.0.1", port)) as conn:
            start = time.perf_counter()
            conn.sendall(payload)
            if conn.recv(1) != b"k":
                raise SystemExit("no acknowledgement from the server")
            print(f"{time.perf_counter() - start:.4f}")
        server.wait(timeout=10)
    finally:
        server.kill()


if __name__ == "__main__":
    {"serve": serve, "send": send}[sys.argv[1]](int(sys.argv[2]))
