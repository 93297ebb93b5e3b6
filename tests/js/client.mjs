// Drives the official Replicate JavaScript client (npm "replicate", unmodified) against a
// Conduit api, for tests/e2e/test_js_client.py.
//
//   node client.mjs <scenario> '<json arguments>'
//
// Environment: CONDUIT_API (the api's base URL, e.g. http://127.0.0.1:8000) and
// REPLICATE_API_TOKEN. Prints one JSON object on stdout: what the scenario saw, including every
// HTTP request the client made (method, URL, whether it sent Authorization), so the test can
// tell how the client reached the server, not only what it got back.

import Replicate from "replicate";

const { validateWebhook } = Replicate;

const requests = [];

// The client's own fetch, recorded: the headers are those the client passed, which are all
// Node's fetch sends besides its defaults (it adds no Authorization of its own).
async function recordingFetch(url, init = {}) {
  const headers = new Headers(init.headers);
  requests.push({
    method: (init.method || "GET").toUpperCase(),
    url: String(url),
    authorization: headers.has("authorization"),
  });
  return fetch(url, init);
}

const replicate = new Replicate({
  auth: process.env.REPLICATE_API_TOKEN,
  baseUrl: `${process.env.CONDUIT_API}/v1`,
  fetch: recordingFetch,
});

function summary(prediction) {
  const { id, status, output, error, urls, version } = prediction;
  return { id, status, output, error, urls, version };
}

async function run({ model, version, input }) {
  return {
    by_model: await replicate.run(model, { input }),
    by_version: await replicate.run(`${model}:${version}`, { input }),
  };
}

async function stream({ model, input }) {
  const events = [];
  for await (const event of replicate.stream(model, { input })) {
    events.push({ event: event.event, data: event.data, id: event.id });
  }
  return { events };
}

async function lifecycle({ version, slow, quick }) {
  const long = await replicate.predictions.create({ version, input: slow });
  const short = await replicate.predictions.create({ version, input: quick });
  const got = await replicate.predictions.get(short.id);
  const page = await replicate.predictions.list();
  const canceling = await replicate.predictions.cancel(long.id);
  const finished = await replicate.wait(short, { interval: 100 });
  const canceled = await replicate.wait(long, { interval: 100 });
  const account = await replicate.accounts.current();
  return {
    account,
    created: [summary(long), summary(short)],
    got: summary(got),
    listed: page.results.map((p) => p.id),
    canceling: summary(canceling),
    finished: summary(finished),
    canceled: summary(canceled),
  };
}

async function createWithWebhook({ version, input, webhook }) {
  const prediction = await replicate.predictions.create({
    version,
    input,
    webhook,
    webhook_events_filter: ["completed"],
  });
  return summary(prediction);
}

async function validate({ id, timestamp, signature, body }) {
  const { key } = await replicate.webhooks.default.secret.get();
  const check = (text) =>
    validateWebhook({ id, timestamp, signature, body: text, secret: key });
  return {
    valid: await check(body),
    tampered: await check(body.replace("succeeded", "failed")),
  };
}


// Files: the client uploads a Buffer with POST /v1/files (multipart: the bytes and a JSON
// metadata part) and passes the file's urls.get as the input; the output is a URL whose bytes
// are fetched without the client (plain http is not wrapped as a FileOutput).
async function runWithBuffer({ model, size, seed }) {
  const bytes = Buffer.alloc(size);
  let state = seed >>> 0;
  for (let i = 0; i < size; i++) {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    bytes[i] = state >>> 24;
  }
  const output = await replicate.run(model, { input: { file: bytes } });
  const url = typeof output === "string" ? output : String(output.url ?? output);
  const fetched = Buffer.from(await (await fetch(url)).arrayBuffer());
  return { output: url, same: fetched.equals(bytes), size: fetched.length };
}

async function hardware() {
  return { hardware: await replicate.hardware.list() };
}

async function createModel({ owner, model: name, hardware }) {
  const model = await replicate.models.create(owner, name, {
    visibility: "private",
    hardware,
    description: "made from JavaScript",
  });
  return { model };
}

// Deploy a registered version, release a new configuration, then delete the deployment, the
// version and the model, in the order the rules allow (the client has no call for the last
// two: its generic request does them).
async function manage({ owner, model: name, version, second, hardware }) {
  const created = await replicate.deployments.create({
    name: `${name}-prod`,
    model: `${owner}/${name}`,
    version,
    hardware,
    min_instances: 1,
    max_instances: 2,
  });
  const updated = await replicate.deployments.update(owner, `${name}-prod`, { max_instances: 4 });
  const released = await replicate.deployments.update(owner, `${name}-prod`, { version: second });
  const fetched = await replicate.deployments.get(owner, `${name}-prod`);
  const deleted = await replicate.deployments.delete(owner, `${name}-prod`);
  const versionsDeleted = [];
  for (const id of [version, second]) {
    const answer = await replicate.request(`/models/${owner}/${name}/versions/${id}`, {
      method: "DELETE",
    });
    versionsDeleted.push(answer.status);
  }
  const modelDeleted = await replicate.request(`/models/${owner}/${name}`, { method: "DELETE" });
  let afterDelete = null;
  try {
    await replicate.models.get(owner, name);
  } catch (error) {
    afterDelete = error.response.status;
  }
  return {
    created,
    updated,
    released,
    fetched,
    deleted,
    versionsDeleted,
    modelDeleted: modelDeleted.status,
    afterDelete,
  };
}

// A training on a version no trainer serves yet: it waits, is read back, listed and canceled.
async function trainings({ owner, model, version, destination, input }) {
  const created = await replicate.trainings.create(owner, model, version, {
    destination,
    input,
  });
  const fetched = await replicate.trainings.get(created.id);
  const listed = await replicate.trainings.list();
  const canceled = await replicate.trainings.cancel(created.id);
  const after = await replicate.trainings.get(created.id);
  return {
    created,
    fetched,
    listed: listed.results.map((training) => training.id),
    canceled: canceled.status,
    after: after.status,
  };
}

async function filesRoundTrip({ text, metadata }) {
  const created = await replicate.files.create(Buffer.from(text), metadata);
  const got = await replicate.files.get(created.id);
  const listed = await replicate.files.list();
  const ids = [];
  for await (const page of replicate.paginate(replicate.files.list)) {
    ids.push(...page.map((file) => file.id));
  }
  await replicate.files.delete(created.id);
  let afterDelete = null;
  try {
    await replicate.files.get(created.id);
  } catch (error) {
    afterDelete = error.response ? error.response.status : String(error);
  }
  return { created, got, listedFirst: listed.results?.[0]?.id ?? null, ids, afterDelete };
}

const scenarios = {
  run,
  stream,
  lifecycle,
  createWithWebhook,
  validate,
  runWithBuffer,
  filesRoundTrip,
  hardware,
  createModel,
  manage,
  trainings,
};

const [name, args = "{}"] = process.argv.slice(2);
const scenario = scenarios[name];
if (!scenario) {
  console.error(`unknown scenario ${name}; one of ${Object.keys(scenarios).join(", ")}`);
  process.exit(2);
}
const result = await scenario(JSON.parse(args));
process.stdout.write(`${JSON.stringify({ ...result, requests })}\n`);
