// The page of `s2core serve`: speaks through POST /v1/audio/speech with raw 16-bit PCM
// streamed as the server decodes it, scheduled on the Web Audio clock piece by piece.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { controller: null, context: null, playhead: 0, pcm: [], rate: 44100 };
window.s2core = { firstAudioMs: null, playing: false, done: false, error: null, samples: 0 };

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = $("api_key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function status(message, isError) {
  $("status").textContent = message;
  $("status").className = isError ? "error" : "";
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    const e = body.error || {};
    return (e.param ? e.param + ": " : "") + (e.message || response.statusText);
  } catch (_) {
    return response.status + " " + response.statusText;
  }
}

async function loadVoices(select) {
  const response = await fetch("/v1/audio/voices", { headers: headers() });
  if (!response.ok) { status(await errorMessage(response), true); return; }
  const { voices } = await response.json();
  const list = $("voice");
  list.innerHTML = "";
  for (const v of voices) {
    const option = document.createElement("option");
    option.value = v.id;
    option.textContent = v.id + (v.seconds ? " (" + v.seconds.toFixed(1) + " s)" : "");
    list.appendChild(option);
  }
  if (select) list.value = select;
}

function number(id, parse) {
  const raw = $(id).value.trim();
  return raw === "" ? undefined : parse(raw);
}

function play(samples) {
  // one piece of audio, scheduled right after the previous one
  const ctx = state.context;
  const buffer = ctx.createBuffer(1, samples.length, state.rate);
  buffer.copyToChannel(samples, 0);
  const source = ctx.createBufferSource();
  source.buffer = buffer;
  source.connect(ctx.destination);
  const start = Math.max(state.playhead, ctx.currentTime + 0.05);
  source.start(start);
  state.playhead = start + buffer.duration;
  window.s2core.playing = true;
}

function wavBlob(chunks, rate) {
  const n = chunks.reduce((a, c) => a + c.length, 0);
  const view = new DataView(new ArrayBuffer(44 + 2 * n));
  const text = (o, s) => { for (let i = 0; i < s.length; i++) view.setUint8(o + i, s.charCodeAt(i)); };
  text(0, "RIFF"); view.setUint32(4, 36 + 2 * n, true); text(8, "WAVEfmt ");
  view.setUint32(16, 16, true); view.setUint16(20, 1, true); view.setUint16(22, 1, true);
  view.setUint32(24, rate, true); view.setUint32(28, 2 * rate, true);
  view.setUint16(32, 2, true); view.setUint16(34, 16, true);
  text(36, "data"); view.setUint32(40, 2 * n, true);
  let o = 44;
  for (const c of chunks) for (let i = 0; i < c.length; i++, o += 2) view.setInt16(o, c[i], true);
  return new Blob([view.buffer], { type: "audio/wav" });
}

async function speak() {
  const text = $("text").value;
  if (!text.trim()) { status("Type something to speak first.", true); return; }
  Object.assign(window.s2core, { firstAudioMs: null, playing: false, done: false, error: null, samples: 0 });
  $("speak").disabled = true; $("stop").disabled = false; $("download").hidden = true;
  $("ttfa").textContent = ""; $("duration").textContent = "";
  state.context = state.context || new AudioContext();
  await state.context.resume();
  state.playhead = 0; state.pcm = [];
  state.controller = new AbortController();
  const body = {
    model: "s2-pro", input: text, voice: $("voice").value || "default",
    response_format: "pcm", stream_format: "audio",
    temperature: number("temperature", parseFloat), top_p: number("top_p", parseFloat),
    top_k: number("top_k", (x) => parseInt(x, 10)), seed: number("seed", (x) => parseInt(x, 10)),
    max_new_tokens: number("max_new_tokens", (x) => parseInt(x, 10)),
  };
  const t0 = performance.now();
  status("Generating...");
  try {
    const response = await fetch("/v1/audio/speech", {
      method: "POST", headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(body), signal: state.controller.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    state.rate = parseInt(response.headers.get("X-Audio-Sample-Rate") || "44100", 10);
    const reader = response.body.getReader();
    let carry = new Uint8Array(0);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      // s16le: an odd byte waits for its partner in the next piece
      const bytes = new Uint8Array(carry.length + value.length);
      bytes.set(carry); bytes.set(value, carry.length);
      const whole = bytes.length - (bytes.length % 2);
      carry = bytes.slice(whole);
      if (whole === 0) continue;
      const ints = new Int16Array(bytes.buffer.slice(0, whole));
      const floats = new Float32Array(ints.length);
      for (let i = 0; i < ints.length; i++) floats[i] = ints[i] / 32768;
      if (window.s2core.firstAudioMs === null) {
        window.s2core.firstAudioMs = performance.now() - t0;
        $("ttfa").textContent = "first audio after " + Math.round(window.s2core.firstAudioMs) + " ms";
        status("Playing while it is generated...");
      }
      state.pcm.push(ints);
      window.s2core.samples += ints.length;
      play(floats);
    }
    const seconds = window.s2core.samples / state.rate;
    $("duration").textContent = seconds.toFixed(2) + " s of audio in " +
      ((performance.now() - t0) / 1000).toFixed(2) + " s";
    const link = $("download");
    if (link.href) URL.revokeObjectURL(link.href);
    link.href = URL.createObjectURL(wavBlob(state.pcm, state.rate));
    link.hidden = false;
    status("Done.");
    window.s2core.done = true;
  } catch (e) {
    if (e.name === "AbortError") { status("Stopped."); }
    else { status(e.message, true); window.s2core.error = e.message; }
  } finally {
    $("speak").disabled = false; $("stop").disabled = true;
    state.controller = null;
  }
}

async function upload() {
  const name = $("voice_name").value.trim();
  const file = $("voice_audio").files[0];
  const transcript = $("voice_text").value.trim();
  if (!name || !file || !transcript) {
    $("upload_status").textContent = "A name, a recording and its transcript, please.";
    return;
  }
  const form = new FormData();
  form.append("name", name); form.append("ref_text", transcript); form.append("audio", file);
  $("upload").disabled = true;
  $("upload_status").textContent = "Encoding the recording...";
  try {
    const response = await fetch("/v1/audio/voices", { method: "POST", headers: headers(), body: form });
    if (!response.ok) throw new Error(await errorMessage(response));
    const voice = await response.json();
    $("upload_status").textContent = "Voice " + voice.id + " added.";
    await loadVoices(voice.id);
  } catch (e) {
    $("upload_status").textContent = e.message;
  } finally {
    $("upload").disabled = false;
  }
}

$("speak").addEventListener("click", speak);
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("upload").addEventListener("click", upload);
$("api_key").addEventListener("change", () => loadVoices());
loadVoices();
