#!/usr/bin/python3
"""Per layer, what storing K and V as f16, f8 (E4M3) or q8_0 does to exact attention, against fp32.
Input: a `topkv kv dump --dtype f32` file (keys, values, decode queries of every layer). f8 and q8_0
are emulated in numpy as src/common/dtype.cpp encodes them (E4M3 round-to-nearest-even, saturating
at 448; q8_0: d = f16(max/127), one f16 step up where 127 d < max, codes rounded against d)."""
import json,struct,numpy as np
import sys
p = sys.argv[1] if len(sys.argv) > 1 else "/tmp/kv15.safetensors"  # topkv kv dump --dtype f32 output
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
    for fn in (f16,f8,q8):
        o=attn(fn(K),fn(V)); errs.append(np.linalg.norm(o-ref)/np.linalg.norm(ref))
    print('%5d %7.1f   %8.5f %8.5f %8.5f'%(L,np.abs(K).max(),*errs))
