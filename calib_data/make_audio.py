"""Writes calib_data/audio/: a few short synthetic 16 kHz mono recordings (tones, chirps, noise bursts), for
calibrating and running audio models (zoo/configs/wav2vec2.yaml). Deterministic: `python calib_data/make_audio.py`
rewrites the same files. 16-bit PCM, except one 32-bit float file so both readers are exercised."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trtforge.runtime.audio import write_wav

RATE = 16000


def recordings(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, bool]]:
    """name -> (samples in [-1, 1], written as float32)."""
    t2 = np.arange(2 * RATE) / RATE
    t3 = np.arange(3 * RATE) / RATE
    tones = 0.3 * np.sin(2 * np.pi * 220 * t2) + 0.2 * np.sin(2 * np.pi * 660 * t2)
    chirp = 0.5 * np.sin(2 * np.pi * (100 * t3 + (4000 - 100) / (2 * 3.0) * t3**2))  # 100 Hz -> 4 kHz over 3 s
    bursts = np.zeros(2 * RATE)
    for start in (0.1, 0.7, 1.3):
        at = int(start * RATE)
        bursts[at : at + RATE // 5] = rng.normal(0, 0.3, RATE // 5) * np.hanning(RATE // 5)
    warble = 0.4 * np.sin(2 * np.pi * 440 * t2 + 3 * np.sin(2 * np.pi * 5 * t2)) + rng.normal(0, 0.02, t2.size)
    return {"tones": (tones, False), "chirp": (chirp, False), "noise_bursts": (bursts, False), "warble_float": (warble, True)}


def main() -> None:
    out = Path(__file__).parent / "audio"
    out.mkdir(exist_ok=True)
    for name, (samples, as_float) in recordings(np.random.default_rng(0)).items():
        write_wav(out / f"{name}.wav", np.clip(samples, -1, 1), RATE, float32=as_float)


if __name__ == "__main__":
    main()
