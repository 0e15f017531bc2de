"""Text to speech in one call: tokenizer, prompt, voice prefix, generation and the audio decoded
as frames come (`pipeline`), and the audio side of it (`audio_out`).

    from s2core.speak import speak, AudioOut
"""

from s2core.speak.audio_out import AudioOut, AudioStats
from s2core.speak.pipeline import SpeakResult, VoiceReport, speak

__all__ = ["speak", "SpeakResult", "VoiceReport", "AudioOut", "AudioStats"]
