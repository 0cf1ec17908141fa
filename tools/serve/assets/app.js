// tenure serve: the page script (served from /assets/app.js; the pages allow no other script).
// Action buttons POST to the JSON API with the bearer token kept in this tab's sessionStorage.
(function () {
  'use strict';
  var KEY = 'tenure.token';

  function token() { return sessionStorage.getItem(KEY) || ''; }

  function say(text, bad) {
    var m = document.getElementById('message');
    if (!m) return;
    m.textContent = text;  // text, never markup
    m.className = bad ? 'bad' : 'ok';
  }

  function showTokenState() {
    var s = document.getElementById('token-state');
    if (s) s.textContent = token() ? 'token set' : 'no token';
  }

  function describe(body) {
    if (body.queue !== undefined) {
      return 'Queue ' + body.queue + (body.paused ? ' paused' : ' resumed') + (body.changed ? '' : ' (no change)');
    }
    if (body.retried) return 'Job ' + body.id + ' will run again.';
    if (body.cancelled) return 'Job ' + body.id + ' cancelled.';
    return 'Done.';
  }

  function act(button) {
    if (!token()) {
      say('Enter the token first (top right), then try again.', true);
      return;
    }
    button.disabled = true;
    fetch(button.dataset.url, {
      method: 'POST',
      headers: { 'Authorization': 'Bearer ' + token() },
      credentials: 'same-origin'
    }).then(function (r) {
      return r.json().then(function (body) { return { ok: r.ok, status: r.status, body: body }; },
                           function () { return { ok: r.ok, status: r.status, body: {} }; });
    }).then(function (r) {
      if (r.ok) {
        say(describe(r.body), false);
        setTimeout(function () { location.reload(); }, 700);
      } else {
        say('Refused (' + r.status + '): ' + (r.body.error || 'no reason given'), true);
        button.disabled = false;
      }
    }, function (e) {
      say('Request failed: ' + e, true);
      button.disabled = false;
    });
  }

  document.addEventListener('DOMContentLoaded', function () {
    var form = document.getElementById('token-form');
    if (form) {
      form.addEventListener('submit', function (e) {
        e.preventDefault();
        var input = document.getElementById('token');
        sessionStorage.setItem(KEY, input.value.trim());
        input.value = '';
        showTokenState();
      });
      showTokenState();
    }
    var buttons = document.querySelectorAll('button.action');
    for (var i = 0; i < buttons.length; i++) {
      buttons[i].addEventListener('click', function (e) { act(e.currentTarget); });
    }
  });
})();
