import multiprocessing as mp, hashlib
data = {i: hashlib.sha1(str(i).encode()).hexdigest() * 4 for i in range(60000)}
def work(k):
    return sum(len(data[j]) for j in range(k, 60000, 97))
if __name__ == '__main__':
    mp.set_start_method('fork')
    with mp.Pool(3) as p:
        print(sum(p.map(work, range(200))))
