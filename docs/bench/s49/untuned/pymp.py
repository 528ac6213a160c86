import multiprocessing as mp, hashlib
def w(i):
    return hashlib.sha256(bytes(range(256)) * (i % 50 + 1) * 100).hexdigest()
if __name__ == "__main__":
    data = [bytes([i % 251]) * 300000 for i in range(100)]  # 30 MB in the parent, shared by fork
    with mp.Pool(3) as p:
        r = p.map(w, range(400))
    print(hashlib.md5("".join(r).encode()).hexdigest(), sum(len(d) for d in data))
