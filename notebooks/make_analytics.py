"""Builds notebooks/analytics.ipynb (unexecuted). Edit this, then run it."""

import nbformat as nbf

cells = []
md = lambda s: cells.append(nbf.v4.new_markdown_cell(s.strip()))  # noqa: E731
code = lambda s: cells.append(nbf.v4.new_code_cell(s.strip()))  # noqa: E731

md("""
# Sensor analytics out of core with tilearray

A tall-skinny matrix of "sensor readings" — by default 2,000,000 samples × 256
channels of float32 (2 GiB) — is driven by a few latent factors plus noise. It
does not fit the memory budget of our workers (1 GiB each), so every statistic
below is computed out of core: column means and standard deviations,
standardisation, the covariance `Z.T @ Z / (n - 1)`, and a PCA of the small
covariance with NumPy. At the end we check that PCA recovered the generator's
factors.

Set `TILEARRAY_NB_ROWS` to run it smaller (the test suite does).
""")
code("""
import os
import tempfile

import dask.array as da
import matplotlib
import matplotlib.pyplot as plt
import numpy as np

import tilearray as ta

N_ROWS = int(os.environ.get("TILEARRAY_NB_ROWS", 2_000_000))
N_CHANNELS, N_FACTORS = 256, 4
workdir = os.environ.get("TILEARRAY_NB_DIR") or tempfile.mkdtemp(prefix="tilearray-nb-")
engine = ta.Engine(n_workers=2, threads_per_worker=1, memory_per_worker="1GiB")
engine
""")
md("""
## Generate the readings

`X = F @ L + noise`: `F` holds the latent factors of each sample, `L` the
loadings of each channel. The generator runs chunk by chunk with dask and
writes Zarr; tilearray opens the result.
""")
code("""
rng = np.random.default_rng(0)
loadings = rng.standard_normal((N_FACTORS, N_CHANNELS)) * np.array([[6.0], [4.0], [3.0], [2.0]])
offsets = rng.uniform(-5, 5, N_CHANNELS)
chunk = 16_384
F = da.random.RandomState(1).standard_normal((N_ROWS, N_FACTORS), chunks=(chunk, N_FACTORS))
noise = da.random.RandomState(2).standard_normal((N_ROWS, N_CHANNELS), chunks=(chunk, N_CHANNELS))
X_dask = (F @ loadings + noise + offsets).astype("float32")
X = ta.from_dask(X_dask, f"{workdir}/readings.zarr", overwrite=True)
X
""")
md("## Column statistics")
code("""
mean = X.mean(axis=0).compute()
std = X.std(axis=0, ddof=1).compute()
print(X.mean(axis=0).stats)
print("first channels' means:", np.round(mean[:5], 3))
print("first channels' stds: ", np.round(std[:5], 3))
""")
md("""
## Standardise and plan the covariance

`Z = (X - mean) / std` is never written: the centring and scaling are fused
into the reads of the matmul. The plan is printed before anything runs.
""")
code("""
Z = (X - X.mean(axis=0)) / X.std(axis=0, ddof=1)
cov_expr = Z.T @ Z / (N_ROWS - 1)
cov_expr.plan()
""")
code("""
cov = cov_expr.compute()
print(cov_expr.stats)
cov.shape, float(np.abs(np.diag(cov) - 1).max())
""")
md("## PCA from the small covariance")
code("""
evals, evecs = np.linalg.eigh(cov)
order = np.argsort(evals)[::-1]
evals, evecs = evals[order], evecs[:, order]
explained = evals / evals.sum()

fig, axes = plt.subplots(1, 2, figsize=(11, 4))
axes[0].bar(np.arange(1, 21), explained[:20])
axes[0].set_xlabel("component")
axes[0].set_ylabel("explained variance ratio")
axes[0].set_title("Scree plot")
im = axes[1].imshow(cov, cmap="RdBu_r", vmin=-1, vmax=1)
axes[1].set_title("Correlation of the 256 channels")
fig.colorbar(im, ax=axes[1])
plt.show()
""")
md("""
## Did we recover the factors?

The generator's loadings, scaled to the standardised channels, span a
4-dimensional subspace. The top four principal directions should span the
same one: the cosines of the principal angles between the two subspaces are
all close to 1.
""")
code("""
scaled = loadings / std[None, :]
q_true, _ = np.linalg.qr(scaled.T)
q_pca = evecs[:, :N_FACTORS]
cosines = np.linalg.svd(q_true.T @ q_pca, compute_uv=False)
print("explained by 4 components:", round(float(explained[:N_FACTORS].sum()), 3))
print("principal-angle cosines:", np.round(cosines, 4))
assert cosines.min() > 0.99, cosines
assert explained[:N_FACTORS].sum() > 0.9
""")
code("""
engine.close()
""")

nb = nbf.v4.new_notebook(cells=cells)
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, "notebooks/analytics.ipynb")
