"""Read one image, video or audio cell of a calibration row into what a processor takes.

Cells come in the layouts datasets are written in:

* an image: a path relative to the data file (or absolute), an `http(s)://` URL (fetched when
  the network allows, as transformers' `load_image` fetches one), raw encoded bytes, or a
  `datasets` Image column as parquet stores it, `{"bytes": ..., "path": ...}`;
* a video: a list of frames, each an image cell as above (video files are not decoded here:
  a processor's own video loading needs torchvision or PyAV);
* audio: a `.wav` path or bytes (read with the standard library's `wave`; other formats with
  `soundfile` where it is installed), a `datasets` Audio column as parquet stores it, the
  decoded layout `{"array": [...], "sampling_rate": n}`, or a list of samples with the row's
  sampling rate.

Every failure is a `DataError` naming the row and the file, so a broken row in thousands is
found at once. Images are decoded completely when read, so a truncated file fails here and not
inside the processor.
"""

from __future__ import annotations

import io
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from llmc_trace.errors import DataError

if TYPE_CHECKING:
    from PIL.Image import Image


def read_image(value: object, *, base: Path, where: str, source: str) -> Image:
    """The image in `value` as an RGB `PIL.Image.Image`; `where` names the cell in errors."""
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    if isinstance(value, PILImage.Image):
        return value.convert("RGB")
    data, name = _bytes_of(value, base=base, where=where, source=source, kind="image")
    try:
        with PILImage.open(io.BytesIO(data)) as image:
            image.load()
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise DataError(
            f"{where}: {name} is not an image Pillow can read ({_first_line(err)})",
            hint="Replace or remove the corrupt file; images must be PNG, JPEG or another "
            "format Pillow opens.",
            source=source,
        ) from err


def read_frames(value: object, *, base: Path, where: str, source: str) -> list[Image]:
    """A video cell (a list of frames) as a list of RGB images."""
    if isinstance(value, (str, bytes, dict)):
        raise DataError(
            f"{where}: a video must be a list of frames (image paths or bytes), got "
            f"{type(value).__name__}",
            hint="Extract the frames to image files and list them in the row, e.g. "
            '{"video": ["frames/0.png", "frames/1.png"]}.',
            source=source,
        )
    if not isinstance(value, Sequence) or len(value) == 0:
        raise DataError(
            f"{where}: a video needs at least one frame",
            hint="List the video's frames as image paths or bytes.",
            source=source,
        )
    return [
        read_image(frame, base=base, where=f"{where}, frame {index}", source=source)
        for index, frame in enumerate(value)
    ]


def read_audio(
    value: object,
    *,
    sampling_rate: int | None,
    target_rate: int,
    base: Path,
    where: str,
    source: str,
) -> np.ndarray:
    """The audio in `value` as mono float32 samples at `target_rate` Hz.

    `sampling_rate` is the row's own rate, for a cell that is a bare list of samples. Audio at
    another rate is resampled by linear interpolation, enough for calibration statistics (the
    feature extractor refuses any rate but its own).
    """
    if isinstance(value, dict) and value.get("array") is not None:
        samples = np.asarray(value["array"], dtype=np.float32)
        rate = value.get("sampling_rate") or sampling_rate
    elif isinstance(value, (list, tuple, np.ndarray)):
        samples, rate = np.asarray(value, dtype=np.float32), sampling_rate
    else:
        data, name = _bytes_of(value, base=base, where=where, source=source, kind="audio")
        samples, rate = _decode_audio(data, name, where=where, source=source)
    if not isinstance(rate, int) or rate <= 0:
        raise DataError(
            f"{where}: the audio has no sampling rate",
            hint='Give one beside the samples: {"audio": {"array": [...], "sampling_rate": '
            "16000}} or a sampling_rate column.",
            source=source,
        )
    if samples.ndim == 2:  # (samples, channels) as soundfile and wave give it
        samples = samples.mean(axis=1)
    if samples.ndim != 1 or samples.size == 0:
        raise DataError(
            f"{where}: the audio holds no samples (shape {tuple(samples.shape)})",
            hint="Give a mono or multi-channel waveform with at least one sample.",
            source=source,
        )
    return _resample(samples, rate, target_rate)


def _bytes_of(
    value: object, *, base: Path, where: str, source: str, kind: str
) -> tuple[bytes, str]:
    """The encoded bytes of a path, bytes or `{"bytes", "path"}` cell, and a name for errors."""
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return bytes(value["bytes"]), f"the {kind} bytes of {value.get('path') or 'the row'}"
        value = value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value), f"the {kind} bytes"
    if isinstance(value, str) and value.lower().startswith(("http://", "https://")):
        return _fetched(value, where=where, source=source, kind=kind), value
    if not isinstance(value, str) or not value:
        raise DataError(
            f"{where} holds a {type(value).__name__}, not an {kind} path or bytes",
            hint=f"Give the {kind} as a path relative to the data file, raw bytes, or "
            '{"bytes": ..., "path": ...}.',
            source=source,
        )
    path = Path(value).expanduser()
    path = path if path.is_absolute() else base / path
    if path.exists() and not path.is_file():
        raise DataError(
            f"{where}: {kind} path {value} is not a file ({path})",
            hint=f"Point the row at the {kind} file itself.",
            source=source,
        )
    if not path.is_file():
        raise DataError(
            f"{where}: {kind} file {value} does not exist (looked for {path})",
            hint=f"{kind.capitalize()} paths are relative to the folder of the data file; fix "
            "the path or remove the row.",
            source=source,
        )
    try:
        return path.read_bytes(), value
    except OSError as err:
        raise DataError(
            f"{where}: {kind} file {value} cannot be read ({err.strerror or err})",
            hint="Check the file's permissions.",
            source=source,
        ) from err


#: Seconds to wait for a media URL before saying the network does not reach it.
URL_TIMEOUT_S = 20.0


def _fetched(url: str, *, where: str, source: str, kind: str) -> bytes:
    """The bytes at `url`; a `DataError` saying URLs need the network when it cannot be read."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=URL_TIMEOUT_S) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as err:
        raise DataError(
            f"{where}: {kind} URL {url} answered HTTP {err.code} ({err.reason})",
            hint=f"Fix the URL, or download the {kind} and point the row at the file.",
            source=source,
        ) from err
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise DataError(
            f"{where}: {kind} URL {url} cannot be fetched ({reason}); URLs are read over the "
            "network, which does not reach it from here",
            hint=f"Run where the network reaches it, or download the {kind}s and give their "
            "paths (relative to the data file) instead of URLs.",
            source=source,
        ) from err


def _decode_audio(data: bytes, name: str, *, where: str, source: str) -> tuple[np.ndarray, int]:
    try:
        with wave.open(io.BytesIO(data)) as reader:
            width, channels = reader.getsampwidth(), reader.getnchannels()
            rate, frames = reader.getframerate(), reader.readframes(reader.getnframes())
    except (wave.Error, EOFError) as wave_err:
        return _decode_with_soundfile(data, name, wave_err, where=where, source=source)
    if width not in _PCM:
        raise DataError(
            f"{where}: {name} is {8 * width}-bit PCM, which is not read here",
            hint="Write the audio as 8-, 16- or 32-bit PCM .wav.",
            source=source,
        )
    dtype, offset, scale = _PCM[width]
    samples = (np.frombuffer(frames, dtype=dtype).astype(np.float32) - offset) / scale
    return samples.reshape(-1, channels), rate


#: wav sample width in bytes -> (numpy dtype, zero level, full scale): 8-bit PCM is unsigned.
_PCM = {1: (np.uint8, 128.0, 128.0), 2: (np.int16, 0.0, 32768.0), 4: (np.int32, 0.0, 2.0**31)}


def _decode_with_soundfile(
    data: bytes, name: str, cause: Exception, *, where: str, source: str
) -> tuple[np.ndarray, int]:
    try:
        import soundfile
    except ImportError:
        raise DataError(
            f"{where}: {name} is not a PCM .wav file ({_first_line(cause)}), and soundfile, "
            "which reads other formats, is not installed",
            hint="Convert the audio to .wav, or pip install soundfile.",
            source=source,
        ) from cause
    try:
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    except (RuntimeError, soundfile.LibsndfileError) as err:
        raise DataError(
            f"{where}: {name} is not audio soundfile can read ({_first_line(err)})",
            hint="Replace or remove the corrupt file.",
            source=source,
        ) from err
    return samples, int(rate)


def _resample(samples: np.ndarray, rate: int, target_rate: int) -> np.ndarray:
    if rate == target_rate:
        return samples.astype(np.float32, copy=False)
    duration = samples.size / rate
    positions = np.arange(int(round(duration * target_rate))) * (rate / target_rate)
    return np.interp(positions, np.arange(samples.size), samples).astype(np.float32)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
