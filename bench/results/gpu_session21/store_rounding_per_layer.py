#!/usr/bin/python3
"""Per layer, what storing K and V as f16, f8 (E4M3) or q8_0 does to exact attention, against fp32.
Input: a `topkv kv dump --dtype f32` file (keys, values, decode queries of every layer). f8 and q8_0
are emulated in numpy as src/common/dtype.cpp encodes them (E4M3 round-to-nearest-even, saturating
at 448; q8_0: d = f16(max/127), one f16 step up where 127 d < max, codes rounded against d).
With --values4, the columns are instead keys as q8_0 and values as 4-bit blocks of 32 (not built
in topkv: an estimate for a 4-bit value store), ggml's Q4_0 (d = the signed largest / -8,
x = d (q - 8)) and Q4_1 (d = (max - min) / 15, x = min + d q), against fp32 and against q8_0
keys and values.

    store_rounding_per_layer.py KV.safetensors [--values4]"""
import json,struct,numpy as np
import sys
args = [a for a in sys.argv[1:] if not a.startswith("--")]
values4 = "--values4" in sys.argv
p = args[0] if args else "/tmp/kv15.safetensors"  # topkv kv dump --dtype f32 output
data=open(p,'rb').read(); n=struct.unpack('<Q',data[:8])[0]; h=json.loads(data[8:8+n]); base=8+n
def get(k):
    v=h[k]; return np.frombuffer(data[base+v['data_offsets'][0]:base+v['data_offsets'][1]],dtype=np.float32).reshape(v['shape'])
def f8(x):
    a=np.abs(x); s=np.sign(x)
    e=np.floor(np.log2(np.maximum(a,2.0**-6)))
    step=2.0**(e-3)
    r=np.round(a/step)*step   # numpy rounds half to even
    return s*np.minimum(r,448.0)
def f16(x): return x.astype(np.float16).astype(np.float32)
def q8(x):
    b=x.reshape(-1,32); amax=np.abs(b).max(1,keepdims=True)
    d=f16(amax/127); d=np.where(127*d<amax, np.nextafter(d.astype(np.float16),np.float16(np.inf)).astype(np.float32), d)
    q=np.where(d>0, np.clip(np.round(b/np.where(d>0,d,1)),-127,127),0)
    return (q*d).reshape(x.shape)
def q4_0(x):
    b=x.reshape(-1,32); i=np.abs(b).argmax(1); m=b[np.arange(len(b)),i][:,None]
    d=f16(m/-8); inv=np.where(d!=0,1/np.where(d!=0,d,1),0)
    q=np.clip(np.floor(b*inv+8.5),0,15)
    return ((q-8)*d).reshape(x.shape)
def q4_1(x):
    b=x.reshape(-1,32); lo=b.min(1,keepdims=True); hi=b.max(1,keepdims=True)
    d=f16((hi-lo)/15); mn=f16(lo); inv=np.where(d>0,1/np.where(d>0,d,1),0)
    q=np.clip(np.floor((b-mn)*inv+0.5),0,15)
    return (mn+q*d).reshape(x.shape)
if values4:
    print('layer  max|k|   attn rel err (K q8_0): V q8_0   V q4_0   V q4_1')
else:
    print('layer  max|k|   attn rel err: f16      f8       q8_0')
n_layers = len([k for k in h if k.endswith(".keys")])
for L in range(n_layers):
    K=get(f'layer{L}.keys'); V=get(f'layer{L}.values'); Q=get(f'layer{L}.queries')  # [kv][n][d], [kv][n][d], [steps][heads][d]?
    if L==0: print('shapes',K.shape,V.shape,Q.shape)
    nkv,nk,d=K.shape; Qr=Q.reshape(-1,Q.shape[-2],d) if Q.ndim==3 else Q
    heads=Qr.shape[1]; g=heads//nkv
    def attn(Kx,Vx):
        out=[]
        for s in range(Qr.shape[0]):
            for hh in range(heads):
                kv=hh//g; sc=Kx[kv]@Qr[s,hh]/np.sqrt(d); sc-=sc.max(); w=np.exp(sc); w/=w.sum(); out.append(w@Vx[kv])
        return np.array(out)
    ref=attn(K,V)
    errs=[]
    pairs = [(q8,q8),(q8,q4_0),(q8,q4_1)] if values4 else [(f16,f16),(f8,f8),(q8,q8)]
    for fk,fv in pairs:
        o=attn(fk(K),fv(V)); errs.append(np.linalg.norm(o-ref)/np.linalg.norm(ref))
    print('%5d %7.1f   %8.5f %8.5f %8.5f'%(L,np.abs(K).max(),*errs))
