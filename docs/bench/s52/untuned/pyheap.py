import sys
files = ['xml', 'dickens', 'samba', 'nci', 'osdb']
lines = []
for f in files:
    lines.extend(open('/work/shared/corpora/silesia/' + f, 'rb').read().split(b'\n'))
d = {i: l.decode('latin1') for i, l in enumerate(lines)}
del lines
t = 0
for r in range(2):
    for k, v in d.items():
        t = (t * 31 + len(v) + k) & 0xffffffff
print(len(d), t)
