// The "Data parallel" dashboard. TensorBoard imports this module in an iframe whose
// base URL is this plugin's routes (data/plugin/data_parallel/) and calls render().
// Plain DOM code: no framework, no build step, nothing loaded from the network.
// Charts are SVG drawn on the server by keras_dp_tools.report.plots, fetched when a chart
// scrolls near the viewport; tables come from the Report's DataFrames as JSON. A strategy
// comparison recorded in the log dir gets its own section above the runs.

const state = { run: null, worker: 'all' };
let observer = null;

export async function render() {
  const style = el('link', { rel: 'stylesheet', href: './static/style.css' });
  document.head.appendChild(style);
  document.body.innerHTML = '';
  const runSelect = el('select', { id: 'run-select', 'aria-label': 'run' });
  const workerSelect = el('select', { id: 'worker-select', 'aria-label': 'worker' });
  const reload = el('button', { id: 'reload', type: 'button' }, 'Reload');
  const status = el('span', { id: 'status', class: 'note' });
  document.body.append(
    el('header', {}, [
      el('h1', {}, 'Data parallel'),
      el('label', {}, ['Run ', runSelect]),
      el('label', {}, ['Worker ', workerSelect]),
      reload,
      status,
    ]),
    el('section', { id: 'comparisons' }),
    el('main', { id: 'main' }),
  );
  runSelect.addEventListener('change', () => {
    state.run = runSelect.value;
    state.worker = 'all';
    showRun();
  });
  workerSelect.addEventListener('change', () => {
    state.worker = workerSelect.value;
    showRun();
  });
  reload.addEventListener('click', () => loadRuns());
  await loadRuns();
}

async function loadRuns() {
  const status = document.getElementById('status');
  status.textContent = 'Loading…';
  const answer = await getJSON('./runs');
  const main = document.getElementById('main');
  if (answer.error && !answer.runs) {
    main.replaceChildren(el('p', { class: 'error' }, answer.error));
    return;
  }
  const comparisons = answer.comparisons || [];
  showComparisons(comparisons);
  const runSelect = document.getElementById('run-select');
  runSelect.replaceChildren(
    ...answer.runs.map((run) =>
      el('option', { value: run.run }, `${run.run} (${run.replicas} replicas, ${run.start})`),
    ),
  );
  status.textContent = `log dir ${answer.log_dir}` + (answer.error ? ` (${answer.error})` : '');
  if (!answer.runs.length) {
    main.replaceChildren(
      el('p', { id: 'no-runs' }, comparisons.length
        ? 'No training records in this log dir besides the strategy comparison.'
        : 'No keras_dp_tools records in this log dir yet: train with ' +
          'kdt.callbacks(log_dir) and press Reload.'),
    );
    observeFigures();
    return;
  }
  if (!answer.runs.some((run) => run.run === state.run)) state.run = answer.runs[0].run;
  runSelect.value = state.run;
  document.body.dataset.scaling = answer.scaling ? 'yes' : 'no';
  state.scaling = answer.scaling;
  await showRun();
}

async function showRun() {
  const main = document.getElementById('main');
  const query = `run=${encodeURIComponent(state.run)}&worker=${state.worker}`;
  const data = await getJSON(`./run?${query}`);
  if (data.error) {
    main.replaceChildren(el('p', { class: 'error' }, data.error));
    return;
  }
  const workerSelect = document.getElementById('worker-select');
  workerSelect.replaceChildren(
    el('option', { value: 'all' }, 'all'),
    ...data.workers.map((w) => el('option', { value: String(w) }, String(w))),
  );
  workerSelect.value = state.worker;
  const h = data.header;
  const sections = [
    el('h2', { id: 'run-title' }, [`Run `, el('span', { id: 'run-id' }, data.run)]),
    el('p', { class: 'meta' },
      `${h.strategy}, ${h.replicas} replicas, ${h.workers} worker(s), global batch ` +
      `${format(h.global_batch)}, ${h.keras_package} ${h.keras_version}, TensorFlow ` +
      `${h.tf_version}, host ${h.hostname}; devices ${(h.devices || []).join(', ')}`),
    el('h2', {}, 'Summary'),
    summaryTable(data.summary),
    readingNote(data.reading),
    el('h2', {}, 'Advice'),
    adviceList(data.advice),
    el('h2', {}, 'Step time'),
    figure('step_time', { worker: state.worker }),
    ...workerSections(data.workers_view),
    el('h2', {}, 'Profiler windows'),
    ...windowSections(data),
    el('h2', {}, 'Communication and wait share'),
    figure('comm_share', { worker: state.worker }),
    el('h2', {}, 'Sync wait per replica and worker'),
    figure('sync_wait', { worker: state.worker }),
    ...syncWaitTables(data.sync_wait),
    el('h2', {}, 'GPU utilization'),
    data.gpu_available
      ? figure('gpu_utilization', { worker: state.worker })
      : el('p', { class: 'note', id: 'gpu-note' },
        `No GPU readings for this run: ${data.gpu_reason || 'GpuMonitor recorded none.'}`),
  ];
  if (state.scaling) {
    sections.push(
      el('h2', {}, 'Scaling (runs of this log dir by replica count)'),
      dataTable(state.scaling, 'scaling-table'),
      figure('scaling', {}),
    );
  }
  main.replaceChildren(...sections);
  document.getElementById('status').textContent +=
    ` · ${data.steps_recorded} step records`;
  observeFigures();
}

// Charts not loaded yet (the comparisons' and the run's) load as they near the viewport.
function observeFigures() {
  if (observer) observer.disconnect();
  observer = 'IntersectionObserver' in window
    ? new IntersectionObserver(loadVisible, { rootMargin: '600px' })
    : null;
  document.querySelectorAll('.figure.loading').forEach((node) => {
    if (observer) observer.observe(node); else loadFigure(node);
  });
}

// Each strategy comparison as the server wrote it (keras_dp_tools.report.comparison):
// how it was measured, the verdict, the labelled table, the chart and the winner's code.
function showComparisons(comparisons) {
  const parts = [];
  comparisons.forEach((c, index) => {
    const id = `comparison-${index}`;
    const textColumns = new Set(c.text_columns);
    const table = el('table', { id: `${id}-table` }, [
      el('tr', {}, c.table.columns.map((name) =>
        el('th', { class: textColumns.has(name) ? 'text' : 'value' }, name))),
      ...c.table.rows.map((row, i) => el('tr', { 'data-candidate': c.candidates[i] },
        row.map((value, j) => el('td', {
          class: textColumns.has(c.table.columns[j]) ? 'text' : 'value',
        }, value)))),
    ]);
    const section = [
      el('h2', {}, c.title),
      el('p', { class: 'note' }, c.settings),
      el('p', { class: 'verdict', id: `${id}-verdict` }, c.verdict),
    ];
    if (c.note) section.push(el('p', { class: 'note' }, `(${c.note})`));
    section.push(table, figure('strategy_comparison', { comparison: c.where }));
    if (c.code) {
      section.push(el('p', {}, `The code that builds the winner, ${c.best}:`),
        el('pre', { class: 'code', id: `${id}-code` }, c.code));
    }
    parts.push(el('div', { class: 'comparison', id }, section));
  });
  document.getElementById('comparisons').replaceChildren(...parts);
}

// The labelled summary as the server wrote it (keras_dp_tools.report.summary_fields):
// label, the value as shown (shares in %), unit; each row names its Report.summary() column.
function summaryTable(rows) {
  return el('table', { id: 'summary' }, [
    el('tr', {}, [el('th', { class: 'text' }, ''), el('th', {}, 'value'),
      el('th', { class: 'text' }, 'unit')]),
    ...rows.map((row) =>
      el('tr', { 'data-field': row.field, title: `Report.summary() column ${row.field}` }, [
        el('td', { class: 'text label' }, row.label),
        el('td', { class: 'value' }, row.shown),
        el('td', { class: 'text unit' }, row.unit),
      ]),
    ),
  ]);
}

function readingNote(reading) {
  return el('div', { class: 'reading', id: 'how-to-read' }, [
    el('h3', {}, reading.title),
    el('ul', {}, reading.lines.map((line) => el('li', {}, line))),
  ]);
}

function adviceList(advice) {
  if (!advice.length) {
    return el('p', { id: 'advice' }, 'No findings: nothing stands out in the recorded numbers.');
  }
  return el('ul', { id: 'advice', class: 'advice' }, advice.map((item) =>
    el('li', {}, [
      el('span', { class: `severity-${item.severity}` }, `${item.severity}: `),
      el('b', { class: 'title' }, item.title),
      el('div', { class: 'evidence' }, `Evidence: ${item.evidence}`),
      el('div', { class: 'fix' }, `Fix: ${item.fix}`),
    ]),
  ));
}

function windowSections(data) {
  const windows = rowsOf(data.windows);
  if (!windows.length) {
    return [el('p', { class: 'note' }, 'No profiler windows (add kdt.DataParallelProfiler).')];
  }
  const out = [
    el('p', { class: 'note' },
      'Each window: the stacked breakdown of its steps (compute, exposed all-reduce ' +
      'transfer and wait, input, other), and its capture in the Profile tab. Opening ' +
      'XProf tools writes cache files next to the capture in the log dir.'),
  ];
  for (const w of windows) {
    const title = `Window ${w.window} (worker ${w.worker}): steps ${w.start_step}–` +
      `${w.end_step === null ? '?' : w.end_step - 1}, ${w.status}`;
    const parts = [el('h3', {}, title)];
    if (w.reason) parts.push(el('p', { class: 'note' }, w.reason));
    if (w.profile_run) {
      parts.push(el('p', {}, [
        el('a', { href: '../../../#profile', target: '_top', class: 'profile-link' },
          'Open the Profile tab'),
        ` and pick the capture ${w.profile_run}.`,
      ]));
    }
    if (w.status === 'analysed') {
      parts.push(figure('step_breakdown', { worker: w.worker, window: w.window }));
    }
    out.push(el('div', { class: 'window' }, parts));
  }
  return out;
}

// A multi-worker run's worker view (all workers): the ranked table, the lines for the
// workers left out of it, and its charts (keras_dp_tools.report.worker_plots).
function workerSections(view) {
  if (!view) return [];
  return [
    el('h2', {}, 'Workers'),
    dataTable(view.table, 'workers-table'),
    ...view.rest.map((line) => el('p', { class: 'note' }, line)),
    ...view.figures.map((name) => figure(name, {})),
  ];
}

function syncWaitTables(syncWait) {
  const out = [];
  if (syncWait.by_replica) {
    out.push(el('h3', {}, 'Sync wait by replica, ms'),
      dataTable(syncWait.by_replica, 'sync-by-replica'));
  }
  if (syncWait.by_worker) {
    out.push(el('h3', {}, 'Sync wait by worker, ms'),
      dataTable(syncWait.by_worker, 'sync-by-worker'));
  }
  return out;
}

function dataTable(table, id) {
  return el('table', { id }, [
    el('tr', {}, table.columns.map((c) => el('th', {}, c))),
    ...table.rows.map((row) => el('tr', {}, row.map((v) =>
      el('td', { class: typeof v === 'number' ? 'value' : 'text' }, format(v))))),
  ]);
}

function rowsOf(table) {
  return table.rows.map((row) =>
    Object.fromEntries(table.columns.map((column, i) => [column, row[i]])));
}

function figure(name, params) {
  const query = new URLSearchParams({ name, run: state.run, ...params });
  return el('div', { class: 'figure loading', 'data-name': name, 'data-src': `./figure?${query}` },
    'Loading chart…');
}

function loadVisible(entries) {
  for (const entry of entries) {
    if (entry.isIntersecting) {
      observer.unobserve(entry.target);
      loadFigure(entry.target);
    }
  }
}

async function loadFigure(node) {
  const response = await fetch(node.dataset.src);
  const text = await response.text();
  node.classList.remove('loading');
  if (!response.ok) {
    node.replaceChildren(el('p', { class: 'error' }, text));
    return;
  }
  // The server's own SVG (matplotlib output), inlined so it scales with the page.
  node.innerHTML = text;
}

async function getJSON(url) {
  const response = await fetch(url);
  try {
    return await response.json();
  } catch (error) {
    return { error: `${url}: HTTP ${response.status}` };
  }
}

function format(value) {
  if (value === null || value === undefined) return '–';
  if (typeof value !== 'number') return String(value);
  if (Number.isInteger(value)) return String(value);
  if (Math.abs(value) >= 1000) return value.toFixed(0);
  if (Math.abs(value) >= 100) return value.toFixed(1);
  return String(Number(value.toPrecision(4)));
}

function el(tag, attributes = {}, children = []) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  for (const child of [].concat(children)) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
