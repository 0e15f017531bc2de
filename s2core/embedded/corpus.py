"""English text the embedded tokenizer's BPE merges are learned from (written for s2core)."""

CORPUS = """\
The first thing you notice about a voice is not the words it says but the way it says them.
A voice carries breath and rhythm, a small pause before an important word, a rise at the end
of a question. When we listen to a friend on the telephone we know who is speaking after a
single sentence, long before we have understood what the sentence means.

Text-to-speech systems try to learn that second layer. A model reads the text, then writes
a sequence of audio codes, frame by frame, about twenty-one frames for every second of sound.
Each frame holds ten numbers: the first one chosen by the large model, the other nine by a
small model that looks only at the present moment. A codec then turns the codes back into a
waveform that a loudspeaker can play.

To copy a voice, the model is shown a short recording of it together with its transcript.
It reads the transcript, listens to the codes of the recording, and then speaks the new text
in the same manner. The recording does not change from one sentence to the next, so the work
the model does while reading it can be kept and reused. That is the whole idea of a voice
prefix: compute once, restore many times.

Good speech needs patience. The model must not stop too early, and it must not repeat
itself. When the same code comes back again and again within a few frames, the sampler
throws the dice once more with a little more freedom, so the voice moves on instead of
humming on one note. When the model decides that the sentence is over, it writes a special
token that ends the turn.

Numbers are read one digit at a time: 1, 2, 3, 4, 5, 6, 7, 8, 9 and 0. Dates such as
12 March 2025, times such as 07:45, prices such as $19.99 and distances such as 3.5 km are
all spelled out by the model as it speaks. Punctuation matters too: commas, full stops,
question marks? and exclamation marks! change the melody of a sentence; quotation marks
"like these" and (brackets) often make the voice a little quieter.

Hello there. How are you today? I am fine, thank you. Please speak slowly and clearly.
This is a test of the speech system. The quick brown fox jumps over the lazy dog. She sells
sea shells by the sea shore. A journey of a thousand miles begins with a single step. Good
morning, good afternoon, good evening and good night. Welcome to the demonstration.
"""
